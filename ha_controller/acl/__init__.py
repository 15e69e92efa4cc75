"""The client ACL (ACL 2.0): users and their policy entries, signed client requests,
and the guard that authorises every request by what it touches.

- :mod:`.model`: users, resources, actions, policy entries, the table (sans-IO);
- :mod:`.legacy`: the users file (RocketMQ's plain ACL in TOML) as a table;
- :mod:`.rules`: what each request code and gRPC method touches;
- :mod:`.credentials`: a client's access key and secret key, and its signatures;
- :mod:`.replay`: refusing copies of signed client requests;
- :mod:`.authorizer`: who signed a request and whether that user may do it;
- :mod:`.guard`: the dispatcher guard of the nameserver and the brokers;
- :mod:`.wire`: the table and the admin requests on the wire.

docs/security.md explains the model to operators.
"""

from ha_controller.acl.authorizer import DENY_REASONS, Acl, AclHolder, peer_ip
from ha_controller.acl.credentials import Credentials
from ha_controller.acl.guard import check_groups, guard
from ha_controller.acl.legacy import Perm, load_acl_file, parse_acl, parse_perm
from ha_controller.acl.model import (
    AclInvalid,
    AclTable,
    Action,
    Decision,
    PolicyEntry,
    Resource,
    User,
    UserStatus,
    UserType,
)
from ha_controller.acl.rules import ADMIN, ANY_USER, GRPC_RULES, RULES, Check, Need, need_of

__all__ = [
    "ADMIN",
    "ANY_USER",
    "DENY_REASONS",
    "GRPC_RULES",
    "RULES",
    "Acl",
    "AclHolder",
    "AclInvalid",
    "AclTable",
    "Action",
    "Check",
    "Credentials",
    "Decision",
    "Need",
    "Perm",
    "PolicyEntry",
    "Resource",
    "User",
    "UserStatus",
    "UserType",
    "check_groups",
    "guard",
    "load_acl_file",
    "need_of",
    "parse_acl",
    "parse_perm",
    "peer_ip",
]
