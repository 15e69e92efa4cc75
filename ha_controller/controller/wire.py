"""The controller's values on the wire (nameserver.proto: GroupState, ControllerView)."""

from __future__ import annotations

from ha_controller.controller.ports import View
from ha_controller.controller.state import GroupState
from ha_controller.proto import nameserver_pb2

__all__ = ["state_from_pb", "state_to_pb", "view_from_pb", "view_to_pb"]


def state_to_pb(state: GroupState) -> nameserver_pb2.GroupState:
    return nameserver_pb2.GroupState(
        epoch=state.epoch,
        master_member=state.master,
        sync_state_set=sorted(state.sync_set),
        master_addr=state.master_addr,
        unclean=state.unclean,
    )


def state_from_pb(cluster: str, group: str, pb: nameserver_pb2.GroupState) -> GroupState:
    return GroupState(
        cluster,
        group,
        pb.epoch,
        pb.master_member,
        frozenset(pb.sync_state_set) | {pb.master_member},
        master_addr=pb.master_addr,
        unclean=pb.unclean,
    )


def view_to_pb(view: View) -> nameserver_pb2.ControllerView:
    pb = nameserver_pb2.ControllerView(enabled=view.enabled, route_id=view.route_id)
    if view.state is not None:
        pb.state.CopyFrom(state_to_pb(view.state))
        pb.has_state = True
    if view.confirmed_age_ms is not None:
        pb.confirmed_age_ms = view.confirmed_age_ms
    return pb


def view_from_pb(cluster: str, group: str, pb: nameserver_pb2.ControllerView) -> View:
    return View(
        pb.enabled,
        state_from_pb(cluster, group, pb.state) if pb.has_state else None,
        pb.route_id,
        pb.confirmed_age_ms if pb.HasField("confirmed_age_ms") else None,
    )
