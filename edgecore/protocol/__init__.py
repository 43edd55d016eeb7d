"""Wire protocol v1: the contract host and device both import (topics, messages, chunks, manifests)."""
