"""Does --inter-node-bandwidth do what it says? A two-container send/recv microbenchmark at
several tc rates, then the pipeline's send/recv time per step against bytes / bandwidth.

    python -m bench.netshape --rates none,1gbit,100mbit,50mbit,20mbit          # microbenchmark
    python -m bench.netshape --pipeline --model small --rates none,100mbit,50mbit   # launcher up 2x1x1 runs

Microbenchmark: two containers of the trainer image (hardened like the nodes) on a fresh
internal network; each eth0 is limited with the launcher's own helper (``Client.run_in_netns``
+ ``layout.tbf_command``), then rank 0 sends ``--mbytes`` MB to rank 1 with gloo
(bench/p2p_worker.py). Prints the achieved Mbit/s against the set rate.
Pipeline: ``launcher up --mesh 2x1x1 --model MODEL --traffic 1 --trace-steps 3-5`` at each rate;
prints the inter-node bytes per step (traffic accounting), the predicted transfer time per step
(bytes each direction / rate), and the measured pp send/recv seconds and step time (the profiled
steps' breakdown, mean over ranks and steps). Containers and networks it made are removed.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from simcluster.launcher.docker.client import Client
from simcluster.launcher.docker.container import log_text, remove, wait
from simcluster.launcher.docker import cluster
from simcluster.launcher.drills.shaping import NETTOOLS_IMAGE, tbf_command
from simcluster.core.units import rate_bits_per_s
from simcluster.launcher.container.layout import IMAGE
from simcluster.core.rundir import read_metrics
from bench.args import positive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def microbench(rate: str | None, mbytes: float, repeats: int) -> dict:
    """One rate: {"rate", "set_mbit", "mbit_s": [per repeat]} from two fresh containers."""
    tag = f"netshape-{os.getpid()}-{int(time.time())}"
    client = Client()  # this machine's daemon
    cluster.create_network(client, tag)
    made = []
    try:
        with tempfile.TemporaryDirectory() as out:
            os.chmod(out, 0o755)
            for rank, name in enumerate((f"{tag}-a", f"{tag}-b")):
                made.append(client.run_container(
                    IMAGE, ["python", "/bench/p2p_worker.py", "--rank", str(rank), "--master", f"{tag}-a",
                            "--mbytes", str(mbytes), "--repeats", str(repeats), "--wait-for", "/out/ready"],
                    name=name, hostname=name, network=tag, user=f"{os.getuid()}:{os.getgid()}",
                    cap_drop=["ALL"], security_opt=["no-new-privileges:true"], environment={"OMP_NUM_THREADS": "1"},
                    volumes=[f"{ROOT}/bench:/bench:ro", f"{out}:/out:ro"]))
            if rate:
                for c in made:
                    client.run_in_netns(NETTOOLS_IMAGE, tbf_command(rate), c)
            with open(os.path.join(out, "ready"), "w") as fh:
                fh.write(rate or "unshaped")
            for c in made:
                wait(c, 600)
            lines = log_text(made[0]).strip().splitlines()
            res = json.loads(lines[-1])
    finally:
        for c in made:
            remove(c)
        cluster.remove_network(client, tag)
    return {"rate": rate or "none", "set_mbit": rate_bits_per_s(rate) / 1e6 if rate else None, **res}


def pipeline(rate: str | None, model: str = "tiny", steps: int = 5) -> dict:
    """One 2x1x1 launcher up run; the profiled steps' pp send/recv and step seconds, mean over ranks."""
    run = os.path.join(ROOT, "runs", f"netshape-{model}-{rate or 'none'}")
    cmd = [sys.executable, "-m", "launcher", "up", "--mesh", "2x1x1", "--model", model, "--steps", str(steps),
           "--val-every", "0", "--traffic", "1", "--trace-steps", f"3-{steps}", "--mount-code", "--quiet",
           "--run-dir", run] + (["--inter-node-bandwidth", rate] if rate else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-2000:])
    prof = [json.load(open(f)) for f in glob.glob(os.path.join(run, "profile", "rank-*.json"))]
    rows = read_metrics(run)
    links = rows[-1]["traffic"]["links"]
    per_dir = max(links.get("0->1", 0), links.get("1->0", 0))
    out = {"rate": rate or "none", "bytes_0to1": links.get("0->1", 0), "bytes_1to0": links.get("1->0", 0),
           "pp_send_recv_s": statistics.mean(p["pp_send_recv"] for p in prof),
           "step_s": statistics.mean(p["step"] for p in prof)}
    out["predicted_s"] = 2 * per_dir * 8 / rate_bits_per_s(rate) if rate else 0.0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="none,1gbit,100mbit,50mbit,20mbit")
    p.add_argument("--mbytes", type=positive(float), default=8.0)
    p.add_argument("--repeats", type=positive(int), default=3)
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--model", default="tiny", help="--pipeline: the model (small: 2 MiB per message)")
    a = p.parse_args()
    rates = [None if r == "none" else r for r in a.rates.split(",")]
    for rate in rates:
        if a.pipeline:
            r = pipeline(rate, a.model)
            print(f"rate {r['rate']:>8}  bytes/step 0->1 {r['bytes_0to1']}  1->0 {r['bytes_1to0']}  predicted "
                  f"transfer {r['predicted_s']:.3f}s  pp send/recv {r['pp_send_recv_s']:.3f}s  step {r['step_s']:.3f}s",
                  flush=True)
        else:
            r = microbench(rate, a.mbytes, a.repeats)
            got = statistics.median(r["mbit_s"])
            ratio = f"  achieved/set {got / r['set_mbit']:.2f}" if r["set_mbit"] else ""
            print(f"rate {r['rate']:>8}  {r['bytes']} B x {a.repeats}: median {got:.1f} Mbit/s "
                  f"(each {', '.join(f'{x:.1f}' for x in r['mbit_s'])}){ratio}", flush=True)


if __name__ == "__main__":
    main()
