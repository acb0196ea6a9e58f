"""Peer systems written from their published algorithms, as benchmark arms (never part of the product).

Each peer is one pure policy core (no I/O, no clock reads: `now` is passed in) that both the simulator
(harness/simlib) and the live proxy (bench/peer_proxy.py) drive, so the simulated and the live arm make
the same decisions. See docs/simulator.md "Peer arms".
"""

from harness.peers.api import PeerPolicy, Wake
from harness.peers.continuum import ContinuumCore, ContinuumParams
from harness.peers.thunderagent import ThunderAgentCore, ThunderAgentParams

PEERS = ("thunderagent", "continuum")

__all__ = [
    "PEERS",
    "ContinuumCore",
    "ContinuumParams",
    "PeerPolicy",
    "ThunderAgentCore",
    "ThunderAgentParams",
    "Wake",
]
