"""The rules every engine shares, checked before anything is written or started (each names the fix, exit 2).

    python -c "from simcluster.launcher.engines.checks import has_registry; print(has_registry('ghcr.io/x/y:1'))"

A multi-host target (slurm with --container-image, jobset, trainjob, a swarm of several nodes)
pulls its image on hosts that never saw this machine's `docker build`: the image must name a
registry (``ghcr.io/me/trainer:1``, ``registry.local:5000/trainer:1``, ``docker.io/me/trainer:1``).
Swarm: ``generate`` only warns (a one-node swarm runs a local image, and the file does not know
the swarm's size; ``docker save | docker load`` on every host works too); ``up --target swarm``
refuses when the swarm has more than one node. Your own code from a host folder (--script,
--code) is bind-mounted by Compose and Swarm (on several swarm hosts: shared storage at the same
path); on the other engines it has to be in the image (--module) or in the Slurm work folder.
``up --target slurm`` needs only Docker (the Slurm image is built when missing). ``--push REGISTRY``
(engines/push.py) names the pushed image instead: the derived image of --requirements may then go to
any target that pulls an image; ``--gpu`` is refused where a document cannot name a model.
"""
from __future__ import annotations

import os
import re

from simcluster.launcher.container.layout import DATA_MOUNT, IMAGE_USER, JOIN_TIMEOUT_S
from simcluster.launcher.job.launch import Launch
from simcluster.core.errors import ConfigError


def has_registry(image: str) -> bool:
    """True when the image's first path part names a registry host (has a dot or a port, or is localhost)."""
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def no_registry(flag: str, image: str, why: str) -> str:
    """The problem of an image other hosts cannot pull, naming the fix."""
    return (f"{flag} {image}: {why}, which cannot see a locally built image; push it to a registry and name it "
            f"there, e.g. {flag} registry.example.com/{image}")


def refuse(engine: str, action: str, tool: str, how: str = "") -> ConfigError:
    """The error of `launcher ACTION --target ENGINE` for an engine this machine only renders for; how: the tool's
    commands there (default: kubectl's)."""
    how = how or (f"{tool} apply -f k8s/mesh-2x2x2-{engine}.yaml, {tool} get pods, {tool} logs, {tool} delete -f ...")
    return ConfigError(f"--target {engine}: `{action}` cannot run a {engine} job here (it needs a real {engine} "
                       f"cluster); write its manifest with `python -m launcher generate --target {engine}` and use "
                       f"{tool} there (e.g. {how})")


def common_problems(engine, launch: Launch, local: bool) -> list[str]:
    """The rules every engine shares, read from its attributes (launcher/engines/base.py Engine):
    your code folder needs an engine that bind-mounts (Compose, Swarm), whose paths hold no ':';
    here at most this machine's CPUs per node; an image other hosts pull names a registry; --stall-s on your
    code only where its ranks get the instruments (``up``: instruments_user_code_up, else instruments_user_code)."""
    errors = []
    if not engine.bind_mounts and launch.code_dir is not None:
        code = next(m.source for m in launch.mounts if m.target == launch.code_dir)
        errors.append(f"--target {engine.name}: your code folder ({code})"
                      f" is mounted only by the Compose and Swarm targets; bake it into an image and pass --image "
                      f"IMAGE --module NAME")
    if engine.bind_mounts:
        errors += _colon_errors(launch)
    if local and launch.node.cpus_per_node is not None and launch.node.cpus_per_node > (os.cpu_count() or 1):
        errors.append(f"--cpus-per-node {launch.node.cpus_per_node:g}: this machine has {os.cpu_count()} CPUs and "
                      f"Docker refuses more ('Range of CPUs is from 0.01 to {os.cpu_count()}.00'); e.g. "
                      f"--cpus-per-node {os.cpu_count()}")
    if launch.engine.hosts is not None and not engine.supports_hosts:
        errors.append(f"--hosts {launch.engine.hosts}: rehearsal hosts are a swarm of Docker engines; add --target "
                      f"swarm (--target {engine.name} runs on its own machines)")
    errors += _uninstrumented(engine, launch, local)
    errors += _image_problems(engine, launch, local) + _unread_options(engine, launch) + _wrapper_only(engine, launch, local)
    if launch.requirements and not engine.runs_here and not launch.engine.push:
        errors.append(f"--requirements: the image it derives lives in this machine's Docker only, and a {engine.name} "
                      f"job pulls its image on its own hosts; build an image with your dependencies (docs/own-code.md), "
                      f"push it and pass --image REGISTRY/NAME:TAG instead, or let --push REGISTRY push it")
    pulled = engine.registry_image(launch, local)
    if pulled and pulled[1] and not has_registry(pulled[1]) and not launch.engine.push:
        errors.append(no_registry(pulled[0], pulled[1], f"a {engine.name} job runs on other hosts"))
    return errors


def _image_problems(engine, launch: Launch, local: bool) -> list[str]:
    """--push where the job pulls no image or runs here, and --gpu where the document cannot name a model
    (``engine.gpu_refusal``: generate only; `up` here reads it as the simulated GPU's model)."""
    errors = []
    if launch.engine.push and local:
        errors.append(f"--push {launch.engine.push}: an option of `generate` (the job goes to another cluster's "
                      f"registry); `up` runs the image here: drop --push")
    elif launch.engine.push and not engine.pulls_image(launch):
        errors.append(f"--push {launch.engine.push}: a {engine.name} document {engine.pulls_nothing}; drop --push")
    if engine.gpu_refusal and not local and launch.train is None and launch.instruments.gpu_given:
        errors.append(f"--gpu {launch.instruments.gpu}: {engine.gpu_refusal}; drop --gpu")
    return errors


# The EngineOptions fields only some engines write (Engine.reads): given to another, refused, never dropped unsaid.
OWN = ("pyxis", "container_image", "workdir", "setup", "runs_claim")


def _unread_options(engine, launch: Launch) -> list[str]:
    """Each option of OWN given other than its default to an engine whose document does not write it; the help
    of the option (launcher/job/sections.py) names the engines that do."""
    from simcluster.launcher.job.sections import EngineOptions, specs

    given = {name: spec for name, spec in specs(EngineOptions).items() if name in OWN
             and name not in engine.reads and getattr(launch.engine, name) != spec.default}
    return [f"{spec.flag}{'' if spec.kind == 'bool' else f' {getattr(launch.engine, name)!r}'}: a {engine.name} "
            f"document has no use for it, only --target "
            f"{' or '.join(re.findall(r'(?:^|; )([a-z/]+):', spec.help)).replace('/', ' or ')} writes it; drop it"
            for name, spec in given.items()]


def _uninstrumented(engine, launch: Launch, local: bool) -> list[str]:
    """Your code on an engine whose document runs its ranks without the instruments (stock torchrun, no node
    wrapper: ``instruments_user_code``, ``_up`` for `up`): each instrument's option given, which nothing there
    would honour (the built-in trainer does these itself, from its own flags)."""
    inst = launch.instruments
    if launch.train is not None or (engine.instruments_user_code_up if local else engine.instruments_user_code):
        return []
    out = []
    if inst.stall_given:
        out.append(f"--stall-s {inst.stall_s:g}: a {engine.name} document runs your code's ranks without the "
                   f"instruments (stock torchrun, no node wrapper), so nothing would watch them on its cluster; drop "
                   f"--stall-s there (the built-in trainer watches itself), or rehearse the hang here with launcher up")
    given = {"--check-devices": inst.check_devices, "--gpu-memory": inst.gpu_memory is not None,
             "--traffic 1": inst.traffic, "--trace-steps (or --profile-step)": bool(inst.trace_steps),
             "--check-collectives 1": inst.check_collectives}
    out += [f"{flag}: an instrument of the rehearsal's simulated nodes, and a {engine.name} document runs your code's "
            f"ranks without them (stock torchrun, no node wrapper), so nothing would do it on its cluster; drop it "
            f"there, and rehearse with it here (launcher up)" for flag, on in given.items() if on]
    return out


# The NodeOptions fields only the simulation's node containers read (Compose, Swarm; Slurm's simulation under `up`):
# a real cluster's document (an engine that bind-mounts nothing) writes none of them, so `generate` refuses them there.
WRAPPER_ONLY = {"user": IMAGE_USER, "join_timeout_s": JOIN_TIMEOUT_S, "mount_code": False}  # field -> its default


def _wrapper_only(engine, launch: Launch, local: bool) -> list[str]:
    """generate for a real cluster: each WRAPPER_ONLY option given other than its default, and each --mount whose
    target is outside /data (a Kubernetes document mounts /data/NAME from its claim, Slurm reads the source path),
    named with why the document has no use for it."""
    if local or engine.bind_mounts:
        return []
    given = [f"--{name.replace('_', '-')}{'' if isinstance(default, bool) else f' {getattr(launch.node, name)!r}'}"
             for name, default in WRAPPER_ONLY.items() if getattr(launch.node, name) != default]
    given += [f"--mount {m.source}:{m.target}" for m in launch.mounts
              if m.target != launch.code_dir and not m.target.startswith(DATA_MOUNT + "/")]
    return [f"{flag}: a {engine.name} document has no use for it: its nodes are the cluster's own (no node container "
            f"of ours, no bind mount), only --target compose or swarm writes it; drop it" for flag in given]


def _colon_errors(launch: Launch) -> list[str]:
    """Compose and Swarm bind mounts are ``SRC:DST:MODE``: a ':' in the run folder, a data path or
    the code folder would split it (Compose: ``too many colons``)."""
    paths = {"--run-dir": launch.run_dir}
    paths.update({"--code (or the --script folder)" if m.target == "/code" else f"the source of {m.target} (--data or "
                  f"--mount)": m.source for m in launch.mounts})
    return [f"{name}: {path!r} has a ':', which splits Compose's bind-mount spec SRC:DST:MODE; rename it without, "
            f"e.g. --run-dir runs/mesh-2x2x2 or --data data/corpus.txt" for name, path in paths.items() if ":" in path]
