"""edgecore: what the workstation and the device both import, and nothing else.

The wire contract (``protocol``: topics, messages, envelopes, manifests, packages, the ledger and
key trust), the MQTT ``transport`` (paho and in-memory), artifact ``delivery`` (chunks over MQTT,
HTTP Range), the runner contract and runtime ``backends``, tensors and feeds, hostile-model
checks, the sandbox, durable writes, settings and errors. It imports neither ``agent`` (the
device daemon) nor the host packages (``edgectl``, ``quantize``, ``targets``); a change here is a
change to both sides. See docs/code-style.md for the layers.
"""

__version__ = "0.1.0"
