"""zrl: distributed reinforcement learning over ZeroMQ with a C++ hot path.

Actors step environments and stream trajectory chunks to a learner over
PUSH/PULL; the learner trains with PyTorch and broadcasts version-tagged
weights over PUB/SUB. See DESIGN.md in docs/ for the map.
"""

__version__ = "0.1.0"
