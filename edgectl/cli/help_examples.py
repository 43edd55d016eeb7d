"""Examples shown under every command's ``--help``: one registry, attached to the command tree in one place.

A command module adds its command's examples to ``EXAMPLES`` under the command path ("rollout status";
"" is ``edgectl`` itself). ``ExamplesGroup`` is the root group's class: when typer builds the command
tree it writes each command's examples into its epilog. tests/cli/test_help_examples.py fails for a
command without examples and for an example that does not parse against its command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from typer.core import TyperCommand, TyperGroup

__all__ = ["EXAMPLES", "Example", "ExamplesGroup", "attach", "epilog"]


@dataclass(frozen=True)
class Example:
    """One command line (starting with ``edgectl``) and what it does, in a few words."""

    line: str
    says: str


def _e(line: str, says: str) -> Example:
    return Example(line, says)


EXAMPLES: Mapping[str, tuple[Example, ...]] = {
    "": (
        _e("edgectl inspect model.onnx --target all", "Which targets can run this model"),
        _e("edgectl --broker mqtt://broker.lan:1883 devices", "List the devices seen on a broker"),
        _e("edgectl --install-completion", "Turn on tab completion for this shell"),
    ),
    # analysis
    "inspect": (
        _e("edgectl inspect model.onnx --target all", "Operator support of the model on every target"),
        _e("edgectl inspect model.onnx --target nnapi --static-shape input=1x3x224x224 --html report.html",
           "One target, a fixed input shape, an HTML report"),
    ),
    "partition": (
        _e("edgectl partition model.onnx --target nnapi -o parts/ --static-shape input=1x3x224x224",
           "Split the model into accelerator and CPU parts"),
    ),
    "targets": (_e("edgectl targets list", "The target profiles this edgectl knows"),),
    "targets list": (
        _e("edgectl targets list", "The target profiles this edgectl knows"),
        _e("edgectl targets list --json", "The same, as JSON"),
    ),
    "targets show": (_e("edgectl targets show nnapi", "Providers, operators and limits of one target"),),
    "quantize": (
        _e("edgectl quantize model.onnx --target cpu-x86 -o model.q.onnx --calib images/",
           "INT8 with real calibration images"),
        _e("edgectl quantize model.onnx --target jetson-orin -o model.int8.onnx --calib calib/ --eval held_out/ "
           "--max-drop 1.0", "Keep the accuracy drop under one point"),
    ),
    # packages
    "build": (
        _e("edgectl build model.onnx --name classifier --version 3 --target jetson-orin -o classifier-3.edgepkg",
           "Build and sign a package for one target"),
        _e("edgectl build det.onnx --name det --version 3 --target nnapi --ort-out android/",
           "Also write the reduced onnxruntime build for Android"),
    ),
    "verify": (
        _e("edgectl verify classifier-3.edgepkg", "Check the signature and hashes with this machine's keys"),
        _e("edgectl verify classifier-3.edgepkg --key package.pub --json", "Check against one key; print the manifest"),
    ),
    "pipeline": (_e("edgectl pipeline build plates.yaml --version 1", "Package a pipeline of several models"),),
    "pipeline build": (
        _e("edgectl pipeline build plates.yaml --version 1 -o plates-1.edgepkg", "Package a pipeline of several models"),
    ),
    "keys": (_e("edgectl keys init", "Create the signing keys of this workstation"),),
    "keys init": (_e("edgectl keys init", "Create the package and controller signing keys"),),
    "keys list": (_e("edgectl keys list", "The signing keys and their ids"),),
    "keys export": (
        _e("edgectl keys export package -o package.pub", "The public key devices trust for packages"),
        _e("edgectl keys export controller -o controller.pub", "The public key devices trust for commands"),
    ),
    "keys rotate": (
        _e("edgectl keys rotate package --device cam-1 --retire-old", "Move cam-1 to a new package key"),
    ),
    # fleet and rollouts
    "deploy": (
        _e("edgectl deploy classifier-3.edgepkg --device cam-1", "Install on one device, in the foreground"),
        _e("edgectl deploy det-orin.edgepkg det-nnapi.edgepkg --fleet group=lobby --wait",
           "Staged rollout to a group, followed until it ends"),
        _e("edgectl deploy det-orin.edgepkg --fleet all --waves 1,10%,100% --gate 'p95_latency <= 1.2x' --dry-run",
           "Print the plan of a gated rollout; send nothing"),
        _e("edgectl deploy det-orin.edgepkg --fleet group:orins", "Staged rollout to a server-side device group"),
        _e("edgectl deploy det-orin.edgepkg --fleet all --start-at 2026-11-28T02:00:00+01:00",
           "Schedule a rollout: it starts at 02:00 (UTC+1) by the controller's clock"),
        _e("edgectl deploy det-orin.edgepkg --fleet group:plant --deadline 2026-12-04T00:00:00Z",
           "Devices install inside their groups' maintenance windows, and all of them from 4 December on"),
    ),
    "devices": (
        _e("edgectl devices", "Every device, its model and its health"),
        _e("edgectl devices --selector group=lobby --json", "The devices of one group, as JSON"),
    ),
    "group": (_e("edgectl group list", "Device groups and how many devices each has now"),),
    "group create": (
        _e("edgectl group create pilot --member cam-1 --member cam-2", "A static group of two devices"),
        _e("edgectl group create orins --query target=jetson-orin,site=lobby --description 'lobby Orins'",
           "A dynamic group, evaluated when a rollout is planned"),
        _e("edgectl group create plant --member cam-1 --protected", "A group whose rollouts need a second operator"),
    ),
    "group list": (_e("edgectl group list --json", "Every group, as JSON"),),
    "group show": (_e("edgectl group show orins", "The devices a group resolves to now"),),
    "group add": (_e("edgectl group add pilot cam-3 cam-4", "Add devices to a static group"),),
    "group remove": (_e("edgectl group remove pilot cam-2", "Take a device out of a static group"),),
    "group protect": (
        _e("edgectl group protect orins", "Rollouts to this group wait for a second operator's approval"),
        _e("edgectl group protect orins --off", "Take the protection off"),
    ),
    "group windows": (
        _e("edgectl group windows plant 'Mon-Fri 22:00-02:00' 'Sat,Sun 00:00-24:00'",
           "Devices of this group install only on weeknights and weekends, in their local time"),
        _e("edgectl group windows plant", "No maintenance windows: install any time"),
    ),
    "group config": (
        _e("edgectl group config plant --set telemetry_interval_s=30 --window 'Sat,Sun 00:00-24:00'",
           "Every device of the group gets its next configuration version"),
    ),
    "group delete": (_e("edgectl group delete pilot", "Delete a group no running rollout uses"),),
    "device": (_e("edgectl device show cam-1", "What one device runs and reports"),),
    "device show": (_e("edgectl device show cam-1", "What one device runs and reports"),),
    "device enroll": (
        _e("edgectl device enroll cam-17 --tags site=lyon,line=3 --broker-url mqtts://broker.lan:8883 --out ./cam-17",
           "Certificate and agent config bundle for a new device"),
    ),
    "device revoke": (_e("edgectl device revoke cam-17", "Revoke the device's certificate"),),
    "device decommission": (
        _e("edgectl device decommission cam-17", "Revoke its certificate, stop its updates, keep it for history"),
        _e("edgectl device decommission cam-17 --pki /secure/pki --json", "With the CA kept elsewhere; JSON outcome"),
    ),
    "device delete": (_e("edgectl device delete cam-17", "Remove a decommissioned device's record and history"),),
    "device logs": (
        _e("edgectl device logs cam-17 --lines 200", "Its newest 200 log lines, redacted of secrets"),
        _e("edgectl device logs cam-17 --since 2026-11-26T08:00:00Z --level WARNING --json",
           "Warnings and errors since 08:00 UTC, as JSON"),
    ),
    "device config": (_e("edgectl device config show cam-17", "Desired and reported configuration, in sync or not"),),
    "device config set": (
        _e("edgectl device config set cam-17 --set telemetry_interval_s=30 --set log_level=DEBUG",
           "A new version: telemetry every 30 s, debug logging"),
        _e("edgectl device config set cam-17 --set inference.max_queue=16 --tag line=3 --json",
           "Bound the inference queue and add a tag; JSON answer"),
        _e("edgectl device config set cam-17 --window 'Sat,Sun 00:00-24:00'",
           "This device installs updates only at weekends, in its local time"),
    ),
    "device config show": (_e("edgectl device config show cam-17 --json", "Desired, reported and sync, as JSON"),),
    "package": (_e("edgectl package list", "Uploaded packages and the rollouts that name them"),),
    "package list": (_e("edgectl package list --json", "Uploaded packages as JSON"),),
    "package delete": (
        _e("edgectl package delete 3f5a0c9e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a19",
           "Delete a package no rollout names"),
    ),
    "audit": (
        _e("edgectl audit --actor 'user:*' --since 2026-01-01", "Every operator action this year"),
        _e("edgectl audit --device cam-17 --csv", "One device's entries as CSV (redirect it to a file)"),
    ),
    "rollout": (_e("edgectl rollout list", "The controller's rollouts"),),
    "rollout list": (
        _e("edgectl rollout list", "The controller's rollouts"),
        _e("edgectl rollout list --json", "The same, as JSON"),
    ),
    "rollout status": (
        _e("edgectl rollout status r-77aa", "Waves, gates and devices of one rollout"),
        _e("edgectl rollout status r-77aa --follow", "Live view until it ends"),
    ),
    "rollout log": (_e("edgectl rollout log r-77aa --json", "The rollout's events, as JSON"),),
    "rollout pause": (_e("edgectl rollout pause r-77aa", "Start and promote no more waves"),),
    "rollout resume": (_e("edgectl rollout resume r-77aa", "Go on after a pause or a halt"),),
    "rollout abort": (_e("edgectl rollout abort r-77aa", "Stop the rollout for good"),),
    "rollout retry-failed": (_e("edgectl rollout retry-failed r-77aa", "Send the update again to failed devices"),),
    "rollout approve": (_e("edgectl rollout approve r-77aa", "Approve a rollout another operator created"),),
    "rollout reject": (_e("edgectl rollout reject r-77aa --reason 'not before the audit'",
                          "Reject a rollout awaiting approval; nothing is sent"),),
    "sim": (
        _e("edgectl sim --profiles jetson-orin:10,nnapi:20,cpu-x86:20 --tag group=lobby",
           "Fifty simulated agents in group lobby"),
        _e("edgectl sim --agents 200 --prefix lab --fallback 5 --duration 600", "200 agents for ten minutes"),
    ),
    # servers
    "controller": (_e("edgectl controller run --http 127.0.0.1:8470", "Controller with REST API and console"),),
    "controller run": (
        _e("edgectl controller run", "Run the fleet controller"),
        _e("edgectl controller run --http 127.0.0.1:8470", "Also serve the REST API and the console"),
    ),
    "api": (_e("edgectl api serve --http 127.0.0.1:8470", "REST API without the controller loop"),),
    "api serve": (_e("edgectl api serve --http 127.0.0.1:8470", "REST API without the controller loop"),),
    "broker": (
        _e("edgectl broker --port 1883", "Embedded development broker"),
        _e("edgectl broker --port 1883 --register", "The same, found by other edgectl commands"),
    ),
    "broker config": (
        _e("edgectl broker config --out ./broker --host broker.lan --port 8883",
           "Mosquitto TLS config, certificates and ACL"),
    ),
    "artifacts": (_e("edgectl artifacts serve ./artifacts --port 8090", "HTTP origin for package payloads"),),
    "artifacts serve": (
        _e("edgectl artifacts serve ./artifacts --host 0.0.0.0 --port 8090", "HTTP origin with Range requests"),
    ),
    "artifacts publish": (
        _e("edgectl artifacts publish det-orin.edgepkg --dir ./artifacts --base-url http://origin:8090",
           "Copy a payload to a served directory; print its URL"),
        _e("edgectl artifacts publish det-orin.edgepkg --s3 s3://models/fleet --endpoint http://minio:9000",
           "Upload to S3 or MinIO"),
    ),
    # security and access
    "pki": (_e("edgectl pki init", "Create the fleet's certificate authority"),),
    "pki init": (_e("edgectl pki init", "Create the fleet's certificate authority"),),
    "pki crl": (_e("edgectl pki crl", "Write the certificate revocation list again"),),
    "users": (_e("edgectl users add alice --role operator", "An operator account"),),
    "users add": (_e("edgectl users add alice --role operator", "An operator account"),),
    "users list": (_e("edgectl users list", "The accounts and their roles"),),
    "users remove": (_e("edgectl users remove alice", "Remove an account and its tokens"),),
    "tokens": (_e("edgectl tokens create alice --expires 90d", "An API token for alice"),),
    "tokens create": (_e("edgectl tokens create alice --name laptop --expires 90d", "An API token for alice"),),
    "tokens list": (_e("edgectl tokens list --user alice", "Alice's tokens"),),
    "tokens revoke": (_e("edgectl tokens revoke tok-1", "Revoke one token by id"),),
    "sso": (_e("edgectl sso check \"$JWT\"", "The user and role a provider's token signs in as"),),
    "sso check": (_e("edgectl sso check \"$JWT\"", "The user and role a provider's token signs in as"),
                  _e("edgectl sso check --json -", "The same, the token from standard input, as JSON")),
    # integrations
    "webhook": (_e("edgectl webhook add https://hooks.example.com/edge --event 'rollout.*'", "Rollout events to a URL"),),
    "webhook add": (
        _e("edgectl webhook add https://hooks.example.com/edge --event 'rollout.*' --event device.deployment_failed",
           "Rollout events and failed installs, signed with a new secret"),
        _e("edgectl webhook add https://ci.example.com/hook --secret-file hook.key --json", "Sign with your own key"),
    ),
    "webhook list": (_e("edgectl webhook list", "Webhooks, their events and secret hints"),),
    "webhook remove": (_e("edgectl webhook remove wh_0123456789abcdef", "Stop sending to a webhook"),),
    "webhook deliveries": (
        _e("edgectl webhook deliveries wh_0123456789abcdef --status failed", "Deliveries that gave up"),
    ),
    "webhook redeliver": (_e("edgectl webhook redeliver dlv_0123456789abcdef", "Send one delivery's event again"),),
}


def epilog(examples: tuple[Example, ...]) -> str:
    """The "Examples" section of a command's help."""
    lines = ["Examples:", ""]
    for example in examples:
        lines += [f"  {example.says}:", f"    $ {example.line}", ""]
    return "\n".join(lines).rstrip()


def attach(command: TyperCommand | TyperGroup, path: str = "") -> None:
    """Write the examples of ``command`` and of every command below it into their epilogs."""
    examples = EXAMPLES.get(path)
    if examples:
        command.epilog = epilog(examples)
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            if isinstance(sub, TyperCommand | TyperGroup):  # typer builds only these
                attach(sub, f"{path} {name}".strip())


class ExamplesGroup(TyperGroup):
    """The root group of ``edgectl``: typer builds it last, with every command below it."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        attach(self)
