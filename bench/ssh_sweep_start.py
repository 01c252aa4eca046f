"""How long fleet_sweep over SSH takes to start its nodes' checks: 8 host names, all aliases of one sshd of our
own on 127.0.0.1 (tests/ssh_helpers.py), the light check gpu_health, one tree against another, alternated.

Per sweep: wall time, and when the first and the last node started its check (s after the call, from the
stored rows' times). Each sweep runs in a child process with PYTHONPATH at the tree it measures, so `--before`
can name another checkout (e.g. main) of the same repository. No cluster, no lock: root and openssh-server.

    python bench/ssh_sweep_start.py --before /work/main --repeats 3
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
HOSTS = 8

ONE_SWEEP = r'''
import json, sys, time
from tools import fleet_sweep as fs
from tools.engine.store import stored_result
called, t0 = time.time(), time.monotonic()
r = fs.SPEC.run(fs.SPEC.Params(hosts=[sys.argv[1]], checks=["gpu_health"], deadline_s=120, plot=False),
                lambda f, m: None)
wall = time.monotonic() - t0
starts = sorted(stored_result(x.result_id)["started"] - called for x in r.rows if x.result_id)
print(json.dumps({"wall_s": round(wall, 2), "first_start_s": round(starts[0], 2) if starts else None,
                  "last_start_s": round(starts[-1], 2) if starts else None, "complete": r.nodes_complete}))
'''


def main() -> int:
    from tests.ssh_helpers import local_sshd, why_no_sshd

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other checkout's root (its tools/ is measured as 'before')")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if why_no_sshd():
        sys.exit(why_no_sshd())
    trees = {"before": str(Path(args.before).resolve()), "after": str(REPO)}
    with local_sshd([f"n{i}" for i in range(1, HOSTS + 1)]) as ssh:
        for rep in range(args.repeats):
            for name, root in trees.items():
                with tempfile.TemporaryDirectory() as home:
                    env = {**os.environ, "MLENG_SSH_CONFIG": str(ssh.config), "MLENG_TRANSPORT": "ssh",
                           "MLENG_HOME": home, "PYTHONPATH": root}
                    load = os.getloadavg()[0]
                    out = subprocess.run([sys.executable, "-c", ONE_SWEEP, f"n[1-{HOSTS}]"], env=env, cwd=root,
                                         capture_output=True, text=True, timeout=300)
                row = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-500:]}
                print(json.dumps({"repeat": rep, "tree": name, "load_1min": round(load, 1), **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
