"""ha-controller: an HA message broker cluster (RocketMQ RIP-32 slave acting master)."""

__version__ = "0.1.0"
