"""Command-line and YAML configuration: ``--config run.yaml`` plus ``--field value`` overrides.

    python -m train --config run.yaml --mesh 2x2x2 --steps 50 --schedule 1f1b
    python -m train --help        # every field, documented
"""
from __future__ import annotations

import argparse
import os
from dataclasses import fields

import yaml

from simcluster.core.config import Config
from simcluster.core.errors import ConfigError
from simcluster.core.config_types import config_from_dict


def field_docs() -> dict[str, str]:
    """Field name -> its one-line documentation (the string after each field of simcluster.core.config.Config)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = nxt.value.value
    return docs


def add_config_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add ``--config`` and one ``--field-name`` option per Config field (default: unset)."""
    parser.add_argument("--config", metavar="YAML", help="YAML file of Config fields; flags override it")
    docs = field_docs()
    for f in fields(Config):
        if f.name in skip:
            continue
        kind = f.type.split("|")[0].strip()
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, default=None,
            type={"int": int, "float": float}.get(kind, str), metavar=kind.upper(),
            help=f"{docs.get(f.name, '')} (default: {f.default})",
        )


class _UniqueKeys(yaml.SafeLoader):
    """safe_load's loader, refusing a key given twice in one mapping (PyYAML keeps the last one, unsaid)."""


def _unique_mapping(loader: _UniqueKeys, node, deep: bool = False) -> dict:
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    for i, (key, _) in enumerate(node.value):
        if keys[i] in keys[:i]:
            raise yaml.constructor.ConstructorError(None, None, f"field {keys[i]!r} is given twice (YAML would keep "
                                                    f"the last one, unsaid); give it once", key.start_mark)
    return loader.construct_mapping(node, deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(path: str) -> dict:
    """Read a YAML mapping of Config fields.

    Raises:
        ConfigError: the file is missing, unparsable (a field given twice too), or not a mapping.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            values = yaml.load(fh, Loader=_UniqueKeys) or {}
    except OSError as e:
        raise ConfigError(f"config: cannot read {path!r}: {e.strerror}; pass an existing YAML file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {path!r} is not valid YAML: {e}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config: {path!r} must hold a mapping of fields (e.g. 'steps: 50'), got {type(values).__name__}")
    return values


def config_from_args(args: argparse.Namespace) -> Config:
    """YAML (if ``--config``) updated by every flag the user set."""
    values = load_yaml(args.config) if getattr(args, "config", None) else {}
    names = {f.name for f in fields(Config)}
    values.update({k: v for k, v in vars(args).items() if k in names and v is not None})
    return config_from_dict(values, source=args.config or "flags")


def save_config(cfg: Config, run_dir: str) -> str:
    """Write the resolved config to RUN_DIR/config.yaml (atomically); returns the path."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "config.yaml")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        yaml.safe_dump(cfg.to_dict(), fh, sort_keys=True)
    os.replace(tmp, path)
    return path
