"""The one error a model directory or a model name can raise."""


class ModelError(ValueError):
    """A model that cannot be built: unknown name, unreadable or invalid config.json,
    unsupported architecture, missing or misshapen tensor. Its message is one line that
    names the file or tensor at fault; the CLI prints it and exits 2."""
