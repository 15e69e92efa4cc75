"""The one table of request codes (method ids).

Ids reuse RocketMQ request codes so that operators recognise them
(docs/protocol.md lists them). Codes above 900000 are ha-controller's own.
"""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    GET_TIMER_CHECK_POINT = 60
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    # not served by the nameserver yet: ``hactl topic delete`` asks and reports
    DELETE_TOPIC_IN_NAMESRV = 216
    QUERY_DATA_VERSION = 322
    RECALL_MESSAGE = 370
    # ACL 2.0 (RocketMQ 5.3's codes): users and their policy entries, Super users only
    AUTH_CREATE_USER = 3001
    AUTH_UPDATE_USER = 3002
    AUTH_DELETE_USER = 3003
    AUTH_GET_USER = 3004
    AUTH_LIST_USER = 3005
    AUTH_CREATE_ACL = 3006
    AUTH_UPDATE_ACL = 3007
    AUTH_DELETE_ACL = 3008
    AUTH_GET_ACL = 3009
    AUTH_LIST_ACL = 3010
    GET_BROKER_MEMBER_GROUP = 901
    BROKER_HEARTBEAT = 904
    NOTIFY_MIN_BROKER_ID_CHANGE = 905
    EXCHANGE_BROKER_HA_INFO = 906
    # controller mode (RIP-44's codes; ha_controller/controller/)
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_GET_REPLICA_INFO = 1004
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    # ha-controller's own
    WATCH_ROUTE = 900001
    GET_BROKER_STATUS = 900002
    # a connection's liveness probe, answered by the peer's connection layer (rpc/connection.py)
    RPC_PING = 900003
    HA_REPORT_OFFSET = 900010
    HA_TRANSFER = 900011
    GET_COMMITLOG_RANGE = 900012
    # the HA port's handshake when the cluster has a secret (ha_controller/auth.py)
    HA_HELLO = 900013
    HA_AUTH = 900014
    # controller mode: a slave's epoch check before its first report (HA port)
    HA_EPOCH = 900015
    GET_TRANSACTION_OFFSETS = 900020
    GET_RECALL_TABLE = 900021
    GET_POP_ACK_TABLE = 900022
    # the ACL table between cluster members (it holds secret keys): ha_controller/acl/
    GET_ACL_TABLE = 900023
    PUT_ACL_TABLE = 900024
    # an acting slave hands a recall to the other members of its group before answering
    PUT_RECALLS = 900025
    # controller mode: a master stops taking writes for a planned switch
    PREPARE_SWITCH = 900030


def method_name(method: int) -> str:
    """A readable name for a method id, also for ids we do not know."""
    try:
        return RequestCode(method).name
    except ValueError:
        return f"UNKNOWN({method})"
