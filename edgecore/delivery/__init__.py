"""Artifact delivery, the device's side: chunks over MQTT, HTTP(S) Range, and their assembly.

Used by the agent and by the simulator (``edgectl sim``), so both speak the same protocol.
"""
