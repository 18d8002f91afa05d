"""The one error of bad input, on both floors: ``ConfigError``.

    python -c "from simcluster.core.errors import ConfigError; print(ConfigError.__mro__[1].__name__)"

Every surface (the CLI, ``simcluster.run``, ``simcluster.compare``, the pytest plugin, the trainer's
preflight) raises it for input that cannot run; the CLI turns it into exit 2.
"""


class ConfigError(ValueError):
    """A bad mesh spec, config field, option, path or run folder; the message names the field, the
    value and a valid example (or the fix)."""
