#!/usr/bin/env python3
"""Several hosts on one machine: Linux network namespaces joined by veth pairs to a bridge, on a private
test subnet, with an Open MPI rsh agent that starts a command "on" a host (`ip netns exec HOST unshare
--uts`, the host name set inside) and a hostfile. Needs root and iproute2.

    cluster = Cluster(2)        # or: with Cluster(2) as cluster: ...
    cluster.up()
    cluster.hosts               # ["scmoe-1234-h0", "scmoe-1234-h1"]: namespace name = host name
    cluster.hostfile            # "scmoe-1234-h0 slots=2" per line
    cluster.agent               # rsh agent script: AGENT [-opts] HOST COMMAND...
    cluster.mpirun_args(slots)  # --mca plm_rsh_agent ... btl/oob_tcp_if_include <subnet> ...
    cluster.cut(1) / cluster.restore(1)   # host 1's link down / up
    cluster.down()              # idempotent; also run at exit and on SIGTERM/SIGINT/SIGHUP

What one cluster makes, all named from a per-run tag "scmoe-<pid>" (links carry the alias TAG, as
interface names are limited to 15 characters):
  namespaces  TAG-h0 ... (lo up; eth0 = the namespace end of a veth pair, 10.213.X.(11+i)/24)
  links       bridge smb<pid> (10.213.X.1/24, the address mpirun listens on), host ends smv<pid>h<i>
  files       /etc/netns/TAG-h<i>/hosts (every host's name and address), a temp dir with the agent
              and the hostfile
X is the first of 10.213.20-249.0/24 (starting at pid % 230) that no route or address here uses.

Teardown kills every process whose network namespace (/proc/PID/ns/net) is one of ours (SIGCONT,
then SIGKILL, so stopped ones die too), deletes the namespaces, the links, /etc/netns/TAG-* and the
temp dir. `down --prefix scmoe-` does the same for every namespace and link left by earlier runs
that crashed.

CLI: netns_cluster.py up N [--slots S]   (prints the hostfile, agent, mpirun args; stays up until
     `down`), down [--tag TAG | --prefix PREFIX]. Exit 77 (skip) without root or `ip netns add`.
"""
import argparse
import atexit
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
STATE_DIR = "/run/scmoe-netns"  # one JSON per cluster left up by the CLI `up`


class Skip(Exception):
    """The machine cannot make namespaces (not root, no iproute2, `ip netns add` refused)."""


def _ip(*args, check=True, ns=None):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r


def netns_inode(name):
    """The inode of a named network namespace (as in /proc/PID/ns/net = net:[INODE]), or None."""
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def pids_in_netns(inodes):
    """PIDs of every process whose network namespace is one of `inodes`."""
    want = {f"net:[{i}]" for i in inodes if i}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") in want:
                pids.append(int(entry))
        except OSError:
            pass
    return pids


def kill_pids(pids, wait_s=5.0):
    """SIGCONT then SIGKILL each pid (a stopped process dies on SIGKILL too, CONT is for its
    children's sake); waits up to wait_s for them to go. Returns the pids still there."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        if left:
            time.sleep(0.05)
    return left


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is gone but for its parent
    except OSError:
        return False


def _used_networks():
    text = _ip("-4", "route", "show", "table", "all", check=False).stdout
    text += _ip("-4", "-o", "addr", "show", check=False).stdout
    nets = []
    for word in text.split():
        try:
            nets.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            pass
    return nets


def pick_subnet(seed):
    used = _used_networks()
    for k in range(230):
        net = ipaddress.ip_network(f"10.213.{20 + (seed + k) % 230}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.213.X.0/24 subnet")


AGENT = r"""#!/bin/sh
# Open MPI rsh agent for the namespace hosts of {tag}: AGENT [ssh options] HOST COMMAND...
# Runs COMMAND (joined by spaces and given to a shell, as ssh does) in HOST's network namespace
# with its own UTS namespace whose host name is HOST.
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done
host=$1; shift
case $host in
{cases}) ;;
*) echo "$0: unknown host '$host'" >&2; exit 255 ;;
esac
exec ip netns exec "$host" unshare --uts -- /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$host" "$*"
"""


class Cluster:
    """N namespace hosts; see the module comment."""

    def __init__(self, num_hosts, slots=2, tag=None, handle_signals=True):
        if not 1 <= num_hosts <= 8:
            raise ValueError("num_hosts: 1..8")
        self.num_hosts = num_hosts
        self.slots = slots
        self.pid = os.getpid()
        self.tag = tag or f"scmoe-{self.pid}"
        self.hosts = [f"{self.tag}-h{i}" for i in range(num_hosts)]
        self.bridge = f"smb{self.pid}"
        self.veths = [f"smv{self.pid}h{i}" for i in range(num_hosts)]
        self.subnet = None
        self.addresses = []
        self.dir = None
        self.agent = None
        self.hostfile = None
        self._inodes = []
        self._down_done = True
        self._handle_signals = handle_signals

    # --- lifecycle -------------------------------------------------------------------------------
    def up(self):
        check_can_run()
        self._down_done = False
        atexit.register(self.down)
        if self._handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, self._on_signal)
        try:
            self._up()
        except Exception:
            self.down()
            raise
        return self

    def _on_signal(self, signum, frame):
        self.down()
        sys.exit(128 + signum)

    def _up(self):
        self.subnet = pick_subnet(self.pid % 230)
        base = self.subnet.network_address
        prefix = self.subnet.prefixlen
        self.bridge_address = str(base + 1)
        self.addresses = [str(base + 11 + i) for i in range(self.num_hosts)]
        self.dir = tempfile.mkdtemp(prefix=f"{self.tag}-")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "alias", self.tag)
        _ip("addr", "add", f"{self.bridge_address}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for a, h in zip(self.addresses, self.hosts)) + f"{self.bridge_address} {self.tag}-bridge\n"
        for i, (host, veth, addr) in enumerate(zip(self.hosts, self.veths, self.addresses)):
            r = _ip("netns", "add", host, check=False)
            if r.returncode != 0:
                raise Skip(f"ip netns add {host} failed: {r.stderr.strip()}")
            self._inodes.append(netns_inode(host))
            peer = f"smp{self.pid}h{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", veth, "alias", self.tag)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("link", "set", peer, "netns", host)
            _ip("link", "set", peer, "name", "eth0", ns=host)
            _ip("addr", "add", f"{addr}/{prefix}", "dev", "eth0", ns=host)
            _ip("link", "set", "eth0", "up", ns=host)
            _ip("link", "set", "lo", "up", ns=host)
            os.makedirs(f"/etc/netns/{host}", exist_ok=True)
            with open(f"/etc/netns/{host}/hosts", "w") as f:
                f.write(hosts_file)
        self.agent = os.path.join(self.dir, "rsh-agent.sh")
        with open(self.agent, "w") as f:
            f.write(AGENT.format(tag=self.tag, cases="|".join(self.hosts)))
        os.chmod(self.agent, 0o755)
        self.hostfile = os.path.join(self.dir, "hostfile")
        with open(self.hostfile, "w") as f:
            f.write("".join(f"{h} slots={self.slots}\n" for h in self.hosts))
        # Every host answers every other (and the bridge) before anyone uses the network.
        for host in self.hosts:
            for addr in self.addresses + [self.bridge_address]:
                r = subprocess.run(["ip", "netns", "exec", host, "ping", "-c1", "-W2", addr], capture_output=True)
                if r.returncode != 0 and shutil.which("ping"):
                    raise RuntimeError(f"{host} cannot reach {addr}")

    def down(self):
        """Kills every process in our namespaces, deletes namespaces, links and files. Idempotent."""
        if self._down_done:
            return
        self._down_done = True
        inodes = [i for i in self._inodes + [netns_inode(h) for h in self.hosts] if i]
        errors = teardown(self.hosts, inodes, self.tag)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        if errors:
            print(f"netns_cluster: teardown of {self.tag}: " + "; ".join(errors), file=sys.stderr)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # --- use -------------------------------------------------------------------------------------
    def mpirun_args(self):
        """mpirun arguments that launch through the agent and keep Open MPI's TCP on the subnet."""
        s = str(self.subnet)
        return ["--mca", "plm_rsh_agent", self.agent, "--mca", "btl_tcp_if_include", s,
                "--mca", "oob_tcp_if_include", s, "--allow-run-as-root", "--oversubscribe"]

    def cut(self, i):
        """Host i's link goes down (its veth end on the bridge): packets vanish, no reset is sent."""
        _ip("link", "set", self.veths[i], "down")

    def restore(self, i):
        _ip("link", "set", self.veths[i], "up")

    def processes(self):
        """PIDs of every process in one of our namespaces."""
        return pids_in_netns(self._inodes)

    def netns_inodes(self):
        return list(self._inodes)

    def host_of_pid(self, pid):
        try:
            link = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        for host, inode in zip(self.hosts, self._inodes):
            if link == f"net:[{inode}]":
                return host
        return None

    def save_state(self):
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(os.path.join(STATE_DIR, self.tag + ".json"), "w") as f:
            json.dump({"tag": self.tag, "hosts": self.hosts, "dir": self.dir}, f)


def check_can_run():
    if os.geteuid() != 0:
        raise Skip("needs root (ip netns add, veth, bridge)")
    for tool in ("ip", "unshare"):
        if not shutil.which(tool):
            raise Skip(f"no '{tool}' on PATH (iproute2 / util-linux)")


def teardown(hosts, inodes, tag):
    """Kills processes in the namespaces, deletes them, the links aliased `tag` and /etc/netns dirs.
    Returns a list of what could not be done."""
    errors = []
    for _ in range(3):  # a dying orted may still fork; repeat until nothing is left
        pids = pids_in_netns(inodes)
        if not pids:
            break
        left = kill_pids(pids)
        if left:
            errors.append(f"pids {left} survive SIGKILL")
    for host in hosts:
        if os.path.exists(f"/run/netns/{host}"):
            r = _ip("netns", "delete", host, check=False)
            if r.returncode != 0:
                errors.append(f"ip netns delete {host}: {r.stderr.strip()}")
        shutil.rmtree(f"/etc/netns/{host}", ignore_errors=True)
    for link in links_with_alias(lambda alias: alias == tag):
        r = _ip("link", "delete", link, check=False)
        if r.returncode != 0 and link in links_with_alias(lambda alias: True):
            errors.append(f"ip link delete {link}: {r.stderr.strip()}")
    try:
        os.remove(os.path.join(STATE_DIR, tag + ".json"))
    except OSError:
        pass
    return errors


def links_with_alias(match):
    """Names of the links in this namespace whose alias satisfies match(alias)."""
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2 or "alias" not in parts:
            continue
        alias = parts[parts.index("alias") + 1]
        if match(alias):
            names.append(parts[1].rstrip(":").split("@")[0])
    return names


def down_prefix(prefix, exact_tag=False, force=False):
    """Cleans the namespaces, links (by alias), /etc/netns dirs and temp dirs of every cluster whose tag
    starts with prefix (exact_tag: whose tag is prefix). Without force, skips clusters whose creating
    process (the pid in "scmoe-<pid>") is still alive: another run may be using them."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]

    def tag_of(name):
        return name.rsplit("-h", 1)[0]

    def wanted(tag):
        return tag == prefix if exact_tag else tag.startswith(prefix)

    tags = {tag_of(n) for n in namespaces if wanted(tag_of(n))} | {a for a in _aliases() if wanted(a)}
    if os.path.isdir("/etc/netns"):
        tags |= {tag_of(d) for d in os.listdir("/etc/netns") if wanted(tag_of(d))}
    skipped = []
    if not force and not exact_tag:
        for tag in sorted(tags):
            m = re.fullmatch(r"scmoe-(\d+)", tag)
            if m and int(m.group(1)) != os.getpid() and _alive(int(m.group(1))):
                skipped.append(tag)
        tags -= set(skipped)
    errors = [f"{t}: its process is alive (another run?); --force removes it anyway" for t in skipped]
    for tag in sorted(tags):
        hosts = [n for n in namespaces if tag_of(n) == tag]
        errors += teardown(hosts, [netns_inode(h) for h in hosts], tag)
        if os.path.isdir("/etc/netns"):
            for d in os.listdir("/etc/netns"):
                if tag_of(d) == tag:
                    shutil.rmtree(os.path.join("/etc/netns", d), ignore_errors=True)
        tmp = tempfile.gettempdir()
        for d in os.listdir(tmp):
            if d.startswith(tag + "-") and os.path.isdir(os.path.join(tmp, d)):
                shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
    return sorted(tags), errors


def _aliases():
    out = _ip("-o", "link", "show", check=False).stdout
    return [p.split()[p.split().index("alias") + 1] for p in out.splitlines() if "alias" in p.split()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="make N hosts and leave them up (until `down --tag`)")
    p_up.add_argument("n", type=int)
    p_up.add_argument("--slots", type=int, default=2, help="slots per host in the hostfile (2)")
    p_down = sub.add_parser("down", help="tear down one cluster (--tag) or every leftover (--prefix)")
    g = p_down.add_mutually_exclusive_group(required=True)
    g.add_argument("--tag", help="the TAG printed by `up`")
    g.add_argument("--prefix", help="every namespace/link whose name or alias starts with this, e.g. scmoe-")
    p_down.add_argument("--force", action="store_true",
                        help="with --prefix: also clusters whose creating process is still alive")
    args = parser.parse_args()
    try:
        check_can_run()
        if args.cmd == "up":
            c = Cluster(args.n, slots=args.slots, handle_signals=False)
            c.up()
            atexit.unregister(c.down)  # stays up past this process
            c.save_state()
            print(json.dumps({"tag": c.tag, "hosts": c.hosts, "subnet": str(c.subnet), "hostfile": c.hostfile,
                              "agent": c.agent, "mpirun_args": c.mpirun_args()}, indent=2))
            return 0
        if args.tag:
            tags, errors = down_prefix(args.tag, exact_tag=True)
        else:
            tags, errors = down_prefix(args.prefix, force=args.force)
        print(f"removed: {', '.join(tags) or 'nothing'}")
        for e in errors:
            print("error: " + e, file=sys.stderr)
        return 1 if errors else 0
    except Skip as e:
        print(f"SKIPPED: {e}")
        return SKIP


if __name__ == "__main__":
    sys.exit(main())
