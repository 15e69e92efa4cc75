"""Helpers that start real ha-controller processes for tests, drills and demos.

Everything is started through the same CLI a user runs (``python -m
ha_controller.cli ...``), on port 0, and waited for through its ready file —
never by sleeping.
"""

from __future__ import annotations

from ha_controller.testing.cluster import (
    FAST_ENV,
    Cluster,
    create_typed_topics,
    run_cluster,
    stored_messages,
)
from ha_controller.testing.processes import (
    ContainerHandle,
    ProcessHandle,
    _base_env,
    _hactl_handle,
    hactl_argv,
    http_get,
    make_workdir,
    nameserver_process,
    run_broker,
    run_container,
    run_nameserver,
    run_proxy,
    serving,
    start_all,
)
from ha_controller.testing.scenarios import (
    run_scenario,
    scenario_main,
    unlike_rocketmq,
)
from ha_controller.testing.spark import (
    local_spark,
    spark_missing,
)
from ha_controller.testing.tls import (
    TlsFiles,
    make_tls_files,
    openssl_missing,
)
from ha_controller.testing.waiting import (
    EventuallyTimeout,
    eventually,
    eventually_sync,
)

__all__ = [
    "Cluster",
    "ContainerHandle",
    "EventuallyTimeout",
    "FAST_ENV",
    "ProcessHandle",
    "TlsFiles",
    "_base_env",
    "_hactl_handle",
    "create_typed_topics",
    "eventually",
    "eventually_sync",
    "hactl_argv",
    "http_get",
    "local_spark",
    "make_tls_files",
    "make_workdir",
    "nameserver_process",
    "openssl_missing",
    "run_broker",
    "run_cluster",
    "run_container",
    "run_nameserver",
    "run_proxy",
    "run_scenario",
    "scenario_main",
    "serving",
    "spark_missing",
    "start_all",
    "stored_messages",
    "unlike_rocketmq",
]
