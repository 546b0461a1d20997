from .fixtures import model_server  # noqa: F401
