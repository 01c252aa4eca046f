"""The SSH node transport (tools/engine/transport.py) against a real sshd on 127.0.0.1: lines credited
to the connection they came on, a dead host silent-as-unreachable, a changed host key an error naming
the host, the deadline killing the command on the node, and host names refused before ssh sees them."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from tests.ssh_helpers import keygen, local_sshd, why_no_sshd
from tools.engine.transport import SSH_CONFIG_ENV, SshTransport, node_set, not_answering

pytestmark = pytest.mark.skipif(bool(why_no_sshd()), reason=why_no_sshd() or "")


def transport(config) -> SshTransport:
    return SshTransport(env={**os.environ, SSH_CONFIG_ENV: str(config)}, connect_timeout_s=5)


def run(config, nodes, argv, deadline_s=20):
    lines = []
    ends = transport(config).run_step(nodes, argv, deadline_s, lambda node, line: lines.append((node, line)))
    return lines, ends


def test_every_node_answers_on_its_own_connection_and_a_dead_one_is_unreachable():
    with local_sshd(["n1", "n2", "n3"], dead=["n4"]) as ssh:
        # A node that claims to be another is still credited to the connection it answered on.
        lines, ends = run(ssh.config, node_set(["n[1-4]"]),
                          ["sh", "-c", 'echo "I am n1, reached as $MLENG_NODE"; echo oops >&2; exit 3'])
    assert sorted(lines) == [(n, f"I am n1, reached as {n}") for n in ("n1", "n2", "n3")]
    for n in ("n1", "n2", "n3"):
        assert (ends[n].how, ends[n].code, ends[n].stderr_tail) == ("exited", 3, "oops\n")
    assert ends["n4"].how == "unreachable" and not_answering(ends["n4"])
    assert ends["n4"].why.startswith("n4: sshd not answering") and "Connection refused" in ends["n4"].why


def test_a_changed_host_key_is_refused_naming_the_host():
    with local_sshd(["n1", "n2"]) as ssh:
        other = keygen(ssh.folder / "other", "not-the-host")
        ssh.known_hosts.write_text(f"{ssh.alias} {other}\n")
        lines, ends = run(ssh.config, ["n1", "n2"], ["echo", "ran"])
    assert lines == []
    for n in ("n1", "n2"):
        assert ends[n].how == "unreachable" and not not_answering(ends[n])
        assert ends[n].why.startswith(f"{n}: its host key is not the one in known_hosts")


def test_an_unknown_host_key_is_not_accepted_on_first_use():
    with local_sshd(["n1"]) as ssh:
        ssh.known_hosts.write_text("")
        lines, ends = run(ssh.config, ["n1"], ["echo", "ran"])
    assert lines == [] and ends["n1"].how == "unreachable" and "host key" in ends["n1"].why


def test_the_deadline_ends_the_command_on_the_node_and_the_node_is_silent():
    mark = f"mleng-transport-{uuid.uuid4().hex[:8]}"
    with local_sshd(["n1"]) as ssh:
        t0 = time.monotonic()
        lines, ends = run(ssh.config, ["n1"], ["sh", "-c", f"echo started; exec sleep 60 # {mark}"], deadline_s=3)
        took = time.monotonic() - t0
        assert lines == [("n1", "started")] and ends["n1"].how == "silent"
        assert took < 6, f"the step took {took:.1f} s past a 3 s deadline"
        for _ in range(100):   # remote_step sees the connection close and kills the group
            if subprocess.run(["pgrep", "-f", mark], capture_output=True).returncode:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the command still runs on the node after the step was cut")


def test_the_node_end_of_a_step_starts_without_the_tool_contract():
    """Every node of a step starts remote_step at once before its command: it imports the standard library
    only (with on_node's imports, pydantic and the tool contract, it cost 0.15 CPU-s a node, and a sweep over
    8 hosts started its checks seconds later than through srun on 2 loaded cores)."""
    import sys

    probe = ("import sys, tools.engine.remote_step; "
             "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('tools', 'pydantic', 'pydantic_core'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in loaded if m.startswith("pydantic")], loaded
    assert set(loaded) <= {"tools", "tools.engine", "tools.engine.borrow", "tools.engine.remote_step"}, loaded


def test_argv_reaches_the_node_as_argv_not_as_shell_text():
    tricky = ["printf", "%s|", "a b", "$(touch /tmp/pwned-mleng)", "'", ";", "*"]
    with local_sshd(["n1"]) as ssh:
        lines, ends = run(ssh.config, ["n1"], tricky)
    assert ends["n1"].code == 0 and lines == [("n1", "a b|$(touch /tmp/pwned-mleng)|'|;|*|")]
    assert not os.path.exists("/tmp/pwned-mleng")


def test_security_options_win_over_any_ssh_config():
    opts = transport("/dev/null").ssh_options()
    for needed in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ForwardAgent=no", "PasswordAuthentication=no",
                   "KbdInteractiveAuthentication=no", "ClearAllForwardings=yes", "ControlMaster=no"):
        assert needed in opts
    assert opts[:3] == ["-T", "-a", "-x"] and opts[opts.index("-F") + 1] == "/dev/null"


@pytest.mark.parametrize("text, why", [
    ("-oProxyCommand=touch_x", "is not a host name"), ("root@gpu1", "is not a host name"),
    ("gpu1:22", "is not a host name"), ("@group", "is not a host name"), ("gpu 1", "is not a host name"),
    ("n[0-99999999]", "more than 100000 names"), ("n[1-", "unclosed"), ("n[3-1]", "backwards"),
    ("n[1-2/2]", "is not a host name"), ("-gpu", "is not a plain host name"), ("", "is not a host name"),
])
def test_host_names_are_refused_before_ssh_sees_them(text, why):
    with pytest.raises(ValueError, match=why):
        node_set([text])


def test_node_sets_expand_as_clustershell_does():
    assert node_set(["gpu-[01-03]", "login1"]) == ["gpu-01", "gpu-02", "gpu-03", "login1"]
    assert node_set(["a[1-2]b[1-2]"]) == ["a1b1", "a1b2", "a2b1", "a2b2"]


def test_the_node_option_runs_a_tool_over_ssh_and_files_it_under_the_node(monkeypatch, mleng_home):
    from tools.engine import store
    from tools.engine.registry import registry
    from tools.engine.runner import execute
    from tools.engine.spec import ToolFailure
    from tools.engine.transport import TRANSPORT_ENV

    spec = registry()["env_report"]
    monkeypatch.setenv(TRANSPORT_ENV, "ssh")
    with local_sshd(["n1"], dead=["n2"]) as ssh:
        monkeypatch.setenv(SSH_CONFIG_ENV, str(ssh.config))
        result = execute(spec, spec.Params(probe_torch=False), timeout_s=120, node="n1")
        with pytest.raises(ToolFailure, match=r"(?s)on node n2 did not answer: ssh exited.*Connection refused"):
            execute(spec, spec.Params(probe_torch=False), timeout_s=60, node="n2")
    assert any(f.startswith("Ran on node n1") and "through ssh" in f for f in result.findings), result.findings
    assert store.query(tool="env_report", limit=1)[0]["host"] == "n1"


def test_a_known_hosts_file_we_are_given_is_the_only_one_used(tmp_path):
    from tools.engine.transport import SSH_KNOWN_HOSTS_ENV

    with local_sshd(["n1"]) as ssh:
        empty = tmp_path / "empty_known_hosts"
        empty.write_text("")
        for known, ran in ((empty, False), (ssh.known_hosts, True)):
            env = {**os.environ, SSH_CONFIG_ENV: str(ssh.config), SSH_KNOWN_HOSTS_ENV: str(known)}
            lines = []
            ends = SshTransport(env=env).run_step(["n1"], ["echo", "ran"], 20, lambda n, line: lines.append(line))
            assert (lines == ["ran"]) == ran and (ends["n1"].how == "exited") == ran, ends


def test_a_node_that_prints_an_endless_line_is_cut_not_buffered_whole():
    """ClusterShell keeps a partial line until its newline: a hostile node's 64 MiB line must reach it cut
    (engine/ssh_lines.py), while the lines after it and the exit status still come through."""
    from tools.engine.ssh_lines import CUT_MARK, MAX_LINE_BYTES
    with local_sshd(["n1"]) as ssh:
        lines, ends = run(ssh.config, ["n1"], ["sh", "-c", "head -c 67108864 /dev/zero | tr '\\0' x; echo; "
                                                          "echo after; head -c 5000000 /dev/zero >&2; exit 4"])
    assert [len(line) for _, line in lines] == [MAX_LINE_BYTES + len(CUT_MARK) - 1, len("after")]
    assert lines[1] == ("n1", "after") and (ends["n1"].how, ends["n1"].code) == ("exited", 4)


def test_a_line_cut_across_reads_keeps_its_count():
    import io

    from tools.engine.ssh_lines import copy_capped

    class Trickle(io.RawIOBase):          # hands out 3 bytes a read, as a slow link would
        def __init__(self, data):
            self.data = data

        def readable(self):
            return True

        def read(self, n=-1):
            piece, self.data = self.data[:3], self.data[3:]
            return piece

    out = io.BytesIO()
    copy_capped(Trickle(b"abcdefghij\nkl\n" + b"m" * 20), out, limit=8)
    assert out.getvalue() == b"abcdefgh ...[line cut by mleng]\nkl\nmmmmmmmm ...[line cut by mleng]\n"
