"""The Ray cluster a config names (ray.address, or RAY_ADDRESS): whether it answers, its live nodes and their
shape. The device plan asks it before anything starts (launch/devices.py), the driver again when it connects
(launch/distributed.py)."""

from __future__ import annotations

import os
import socket

from leap_finetune.errors import LeapError


def ray_address(resolved) -> str | None:
    return (resolved.ray.address if resolved.ray else None) or os.environ.get("RAY_ADDRESS") or None


def check_reachable(address: str, timeout: float) -> None:
    """A Ray address that does not answer is an error within `timeout` seconds, not a hang."""
    if address == "auto":
        return  # Ray finds the local cluster's address file itself
    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port or 6379)), timeout=timeout):
            return
    except (OSError, ValueError) as err:
        raise LeapError(
            f"the Ray cluster at {address} does not answer ({err})",
            where="ray.address",
            fix="start it (ray start --head) or check the address; without ray.address and RAY_ADDRESS "
            "a local Ray instance is started",
        ) from None


def cluster_nodes(address: str, timeout: float) -> list[dict]:
    """The resources of each live node of an existing Ray cluster (connects, reads, disconnects; a connection this
    process already holds is read as it is, as run_on_ray would use it)."""
    import ray

    if ray.is_initialized():
        return alive_nodes()
    check_reachable(address, timeout)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return alive_nodes()
    finally:
        ray.shutdown()


def alive_nodes() -> list[dict]:
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def cluster_shape(nodes: list[dict]) -> tuple[int, int]:
    """(nodes, GPUs per node) of a cluster's live nodes: those with GPUs, when some have them."""
    gpus = [int(node.get("GPU", 0)) for node in nodes]
    with_gpus = [g for g in gpus if g > 0]
    return (len(with_gpus), min(with_gpus)) if with_gpus else (len(nodes), 0)
