"""cdi: a Containerized Data Importer compatible with KubeVirt CDI's API."""

__version__ = "0.1.0"
