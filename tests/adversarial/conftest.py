"""The replicated-controller fixtures (a PostgreSQL cluster, two `edgectl controller run` processes, the wire)
shared with tests/replicas: the leadership attacks run on the same plane; the store failure tests' ``plane``."""

from tests.adversarial.store_plane import plane
from tests.replicas.conftest import postgres, replicas

__all__ = ["plane", "postgres", "replicas"]
