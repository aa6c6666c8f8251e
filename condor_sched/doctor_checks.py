"""The checks of ``condor-sched doctor``: pure functions of a :class:`HostView`.

Each check reads what a host's role needs (its HTCondor knobs, the files they name, the
collector's ads) through the view and returns :class:`Finding` s: one per thing that is
right, one per problem with its fix. Nothing here writes anything or runs a program; the
expected knobs and values are read from the shipped config.d snippets.
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from cosched_node import describe, hardware
from cosched_node import state as node_state
from cosched_node.config import DEFAULT_NODE_CONFIG, NodeConfig, load_node_config, state_dir_for

from condor_sched import __version__
from condor_sched.daemon import AD_TYPE
from condor_sched.install import InstallPaths, config_snippet

READ, WRITE, EXECUTE = 4, 2, 1
#: The kinds of ads ``HostView.query_ads`` returns: the sidecars' own ads (MyType
#: "CoSchedSidecar"), and the startd ads of condor_sched's execute nodes (those whose startd
#: cron advertises CoSchedNodeConfigOK), with Machine, Name and CoSchedNodeVersion.
SIDECAR_ADS, NODE_ADS = AD_TYPE, "CoSchedNode"
#: What a launcher's first bytes must name to be condor-sched's (pip's console script imports it).
LAUNCHER_MARKS = (b"condor_sched", b"condor-sched")
#: The startd cron's default --max-age: 3 node-agent intervals and room for a slow one.
HEARTBEAT_MAX_AGE_S = 180.0
SCHEDD_SNIPPET, STARTD_SNIPPET, EXECUTE_SNIPPET = \
    "10-cosched-schedd.conf", "20-cosched-startd.conf", "30-cosched-execute.conf"
#: The comment heading the schedd snippet's offer knobs.
OFFER_HEADING = "# Offer order and offers per cycle"
#: The execute snippet's knobs an execute node of condor_sched must have.
EXECUTE_KNOBS = ("STARTER_DEFAULT_JOB_HOOK_KEYWORD", "COSCHED_HOOK_PREPARE_JOB", "STARTD_CRON_JOBLIST", "DAEMON_LIST")
_MACRO = re.compile(r"\$\((?P<name>[A-Za-z_][A-Za-z0-9_.]*)(?::(?P<default>[^)]*))?\)")
_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.]*)\s*(?P<op>@?=)\s*(?P<value>.*)$")


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's result: ``ok`` with what was checked, or a problem with why and the fix."""

    ok: bool
    what: str
    why: str = ""
    fix: str = ""


def passed(what: str, detail: str = "") -> Finding:
    return Finding(True, what, detail)


def failed(what: str, why: str, fix: str) -> Finding:
    return Finding(False, what, why, fix)


@dataclass(frozen=True, slots=True)
class Account:
    """A local account: who a daemon runs as, for deciding access from mode bits."""

    name: str
    uid: int
    gids: frozenset[int]


def lookup_account(spec: str) -> Account:
    """The account a ``<DAEMON>_USERID`` knob names: a user name, a uid or ``uid.gid``.
    KeyError when the name is unknown."""
    numeric = re.fullmatch(r"(\d+)(?:\.(\d+))?", spec.strip())
    if numeric:
        uid = int(numeric[1])
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return Account(spec, uid, frozenset({int(numeric[2] or uid)}))
        gid = int(numeric[2]) if numeric[2] else entry.pw_gid
    else:
        entry = pwd.getpwnam(spec.strip())
        uid, gid = entry.pw_uid, entry.pw_gid
    groups = {g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    return Account(entry.pw_name, uid, frozenset({gid, *groups}))


ROOT = Account("root", 0, frozenset({0}))


def permits(info: os.stat_result, account: Account, want: int) -> bool:
    """Whether ``account`` has the ``want`` bits (READ|WRITE|EXECUTE) on a file of this stat:
    root bypasses all but a file's execute bits; others get the owner's, group's or others'
    bits, the first class they fall in."""
    mode = info.st_mode
    if account.uid == 0:
        return not (want & EXECUTE and not stat.S_ISDIR(mode)) or bool(mode & 0o111)
    shift = 6 if info.st_uid == account.uid else 3 if info.st_gid in account.gids else 0
    return (mode >> shift) & want == want


def describe_stat(info: os.stat_result) -> str:
    return f"owner {info.st_uid}:{info.st_gid}, mode {stat.S_IMODE(info.st_mode):04o}"


def directories_above(path: str) -> Iterator[str]:
    """The directories from ``/`` down to the one holding ``path``."""
    parts = os.path.dirname(os.path.abspath(path)).split(os.sep)
    for depth in range(1, len(parts) + 1):
        yield os.sep.join(parts[:depth]) or os.sep


def shebang_interpreter(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names, or None for a file without one."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    return words[0] if words else ""


@dataclass(frozen=True)
class HostView:
    """What doctor reads of one host: its HTCondor knobs (a mapping like ``htcondor2.param``),
    the collector's ads (``query_ads(kind)``, kind one of :data:`SIDECAR_ADS` / :data:`NODE_ADS`;
    raises when the collector does not answer), its name, the root below which the hardware
    is probed, the clock and the account lookup."""

    param: Mapping[str, Any]
    query_ads: Callable[[str], list[Mapping[str, Any]]]
    host: str
    hardware_root: str = "/"
    clock: Callable[[], float] = time.time
    node_config_override: str | None = None
    accounts: Callable[[str], Account] = lookup_account
    #: nvidia-smi and micinfo for the hardware probe (None: from PATH; "none": skipped).
    nvidia_smi: str | None = None
    micinfo: str | None = None
    version: str = __version__
    #: A shipped config.d snippet's text by name.
    snippet: Callable[[str], str] = config_snippet
    #: One startd among several on the host (its local name): its ``L.``-prefixed knobs first.
    local_name: str | None = None

    def knob(self, name: str) -> str | None:
        """A knob's value as text (the local name's ``L.NAME`` first), None when unset or empty."""
        if self.local_name:
            own = self._knob(f"{self.local_name}.{name}")
            if own is not None:
                return own
        return self._knob(name)

    def _knob(self, name: str) -> str | None:
        try:
            value = self.param.get(name)
        except Exception:   # htcondor2.param raises for a value it cannot convert
            return None
        text = "" if value is None else str(value).strip()
        return text or None

    def words(self, name: str) -> list[str]:
        """A list knob's items (comma or space separated)."""
        return [w for w in re.split(r"[,\s]+", self.knob(name) or "") if w]

    def has_word(self, name: str, word: str) -> bool:
        return word.casefold() in {w.casefold() for w in self.words(name)}

    def expand(self, value: str) -> str:
        """``$(NAME)`` and ``$(NAME:default)`` replaced by this host's values."""
        return _MACRO.sub(lambda m: self.knob(m["name"]) or (m["default"] or ""), value)

    @property
    def short_names(self) -> set[str]:
        """This host's short names: FULL_HOSTNAME's and the STARTD_NAME's host part."""
        names = {self.host.partition(".")[0].lower()}
        startd_name = self.knob("STARTD_NAME") or ""
        if "@" in startd_name:
            names.add(startd_name.rpartition("@")[2].partition(".")[0].lower())
        if self.local_name:   # one startd of several: a node of its own name and host name
            names |= {n.partition(".")[0].lower() for n in (startd_name, self.knob("NETWORK_HOSTNAME") or "") if n}
        return names

    @property
    def node_config_path(self) -> str:
        """``--node-config`` of COSCHED_HOOK_PREPARE_JOB_ARGS, unless overridden; else the default."""
        if self.node_config_override:
            return self.node_config_override
        if self.local_name and self.knob("COSCHED_NODE_CONFIG"):
            return str(self.knob("COSCHED_NODE_CONFIG"))   # discover_devices --local-name writes L.COSCHED_NODE_CONFIG
        found = re.search(r"--node-config(?:\s+|=)(\S+)", self.knob("COSCHED_HOOK_PREPARE_JOB_ARGS") or "")
        return found[1] if found else DEFAULT_NODE_CONFIG

    @property
    def node_hooks(self) -> str:
        return self.knob("COSCHED_NODE_HOOKS") or "$(COSCHED_NODE_HOOKS)"


def snippet_assignments(text: str) -> list[tuple[str, str]]:
    """``(knob, value)`` of every assignment of an HTCondor config text, in order: ``\\``
    continuations joined, ``NAME @=end ... @end`` blocks as their lines, comments skipped."""
    out = []
    lines = iter(text.splitlines())
    for line in lines:
        match = _ASSIGNMENT.match(line.strip())
        if not match or line.lstrip().startswith("#"):
            continue
        value = match["value"]
        if match["op"] == "@=":
            end = "@" + value.strip()
            body = []
            for inner in lines:
                if inner.strip() == end:
                    break
                body.append(inner.strip())
            value = "\n".join(body)
        else:
            while value.endswith("\\"):
                value = value[:-1] + " " + next(lines, "").strip()
        out.append((match["name"], value.strip()))
    return out


def appended_words(name: str, value: str) -> list[str] | None:
    """The items ``NAME = $(NAME) a b`` appends; None when the value does not extend itself."""
    own = re.compile(r"\$\(" + re.escape(name) + r"\)", re.IGNORECASE)
    if not own.search(value):
        return None
    return [w for w in re.split(r"[,\s]+", own.sub(" ", value)) if w]


def install_fix(snippet: str, hosts: str) -> str:
    return (f"install config.d/{snippet} on {hosts} (`condor-sched config {snippet} > "
            f"/etc/condor/config.d/{snippet}`), then condor_reconfig")


def _missing(expected: list[str], present: list[str]) -> list[str]:
    have = {w.casefold() for w in present}
    return [w for w in expected if w.casefold() not in have]


# ---- the sidecar's host ---------------------------------------------------------------

def sidecar_account(view: HostView) -> tuple[Account | None, list[Finding]]:
    """The account COSCHED_SIDECAR_USERID names (root when unset), or a finding it is unknown."""
    spec = view.knob("COSCHED_SIDECAR_USERID")
    if spec is None:
        return ROOT, []
    try:
        return view.accounts(spec), []
    except KeyError:
        return None, [failed(f"sidecar account COSCHED_SIDECAR_USERID = {spec}", "no such account on this host",
                             "create the account, or set COSCHED_SIDECAR_USERID to an existing one (a queue super "
                             "user of every schedd), then condor_reconfig")]


def check_sidecar_program(view: HostView, account: Account) -> list[Finding]:
    """COSCHED_SIDECAR is an existing condor-sched launcher ``account`` may run, told ``run``."""
    fix = (f"set COSCHED_SIDECAR in 50-cosched-sidecar.conf to this install's launcher "
           f"({InstallPaths.running().sidecar}; `condor-sched config 50-cosched-sidecar.conf` writes it), "
           "then condor_reconfig")
    path = view.knob("COSCHED_SIDECAR")
    if path is None:
        return [failed("sidecar program COSCHED_SIDECAR", "not set, but DAEMON_LIST names COSCHED_SIDECAR", fix)]
    what = f"sidecar program COSCHED_SIDECAR = {path}"
    try:
        info = os.stat(path)
    except OSError as e:
        return [failed(what, e.strerror or str(e), fix)]
    if not stat.S_ISREG(info.st_mode):
        return [failed(what, "not a regular file", fix)]
    if not permits(info, account, READ | EXECUTE):
        return [failed(what, f"{account.name} cannot read and execute it ({describe_stat(info)})",
                       f"chmod 755 {path}")]
    for directory in directories_above(os.path.realpath(path)):
        dir_info = os.stat(directory)
        if not permits(dir_info, account, EXECUTE):
            return [failed(what, f"{account.name} cannot search directory {directory} ({describe_stat(dir_info)})",
                           f"chmod o+x {directory}")]
    interpreter = shebang_interpreter(path)
    if interpreter is not None:
        try:
            runnable = permits(os.stat(interpreter), account, EXECUTE)
        except OSError:
            runnable = False
        if not runnable:
            return [failed(what, f"its interpreter {interpreter or '(none)'} is missing or not executable "
                                 "(a moved or removed virtualenv?)", fix)]
        with open(path, "rb") as handle:
            head = handle.read(8192)
        if not any(mark in head for mark in LAUNCHER_MARKS):
            return [failed(what, "a script that does not start condor-sched (it names no condor_sched)", fix)]
    findings = [passed(what, f"executable by {account.name}")]
    arguments = view.words("COSCHED_SIDECAR_ARGS")
    if arguments[:1] != ["run"]:
        findings.append(failed(f"sidecar arguments COSCHED_SIDECAR_ARGS = {' '.join(arguments)}",
                               "the master must start `condor-sched run`",
                               "set COSCHED_SIDECAR_ARGS = run (50-cosched-sidecar.conf), then condor_reconfig"))
    return findings


def write_problem(path: str, account: Account) -> tuple[str, str]:
    """Why ``account`` cannot append to (or create) ``path``, and the fix; ("", "") when it can."""
    for directory in directories_above(path):
        try:
            info = os.stat(directory)
        except OSError as e:
            return (f"directory {directory}: {e.strerror}",
                    f"mkdir -p {os.path.dirname(path)} && chown {account.name} {os.path.dirname(path)}")
        if not stat.S_ISDIR(info.st_mode):
            return f"{directory} is not a directory", "point COSCHED_LOG elsewhere"
        if not permits(info, account, EXECUTE):
            return (f"{account.name} cannot search directory {directory} ({describe_stat(info)})",
                    f"chmod o+x {directory} (or let {account.name}'s group search it)")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        directory = os.path.dirname(os.path.abspath(path))
        info = os.stat(directory)
        if permits(info, account, WRITE | EXECUTE):
            return "", ""
        return (f"it does not exist and {account.name} cannot create it in {directory} ({describe_stat(info)})",
                f"touch {path} && chown {account.name} {path}")
    if stat.S_ISDIR(info.st_mode):
        return "a directory", "point COSCHED_LOG at a file"
    if permits(info, account, WRITE):
        return "", ""
    return f"{account.name} cannot write it ({describe_stat(info)})", f"chown {account.name} {path}"


def check_sidecar_log(view: HostView, account: Account) -> list[Finding]:
    """COSCHED_LOG (or its directory, before the first start) is writable by the sidecar's account."""
    path = view.knob("COSCHED_LOG")
    if path is None:
        return [failed("sidecar log COSCHED_LOG", "not set: the sidecar logs to stderr, which the condor_master "
                       "discards", "set COSCHED_LOG = $(LOG)/CoSchedLog (50-cosched-sidecar.conf), then condor_reconfig")]
    what = f"sidecar log COSCHED_LOG = {path}"
    why, fix = write_problem(path, account)
    if not why:
        return [passed(what, f"writable by {account.name}")]
    user = "" if account.uid == 0 else " (COSCHED_SIDECAR_USERID)"
    fallback = f"{path}.{account.name}"
    meanwhile = (f"until then the sidecar logs to {fallback} beside it" if not write_problem(fallback, account)[0]
                 else f"it cannot write {fallback} either, so the sidecar refuses to start (journalctl -t "
                      "condor-sched says why)")
    return [failed(what, f"the sidecar's account {account.name}{user} cannot write it: {why}", f"{fix}; {meanwhile}")]


# ---- schedd hosts ---------------------------------------------------------------------

def check_schedd(view: HostView) -> list[Finding]:
    """The schedd snippet's transforms, protected attributes and offer knobs are in effect."""
    text = view.snippet(SCHEDD_SNIPPET)
    shipped = snippet_assignments(text)
    fix = install_fix(SCHEDD_SNIPPET, "this schedd host")
    findings = []
    for knob in ("JOB_TRANSFORM_NAMES", "PROTECTED_JOB_ATTRS"):
        expected = [w for name, value in shipped if name == knob for w in appended_words(name, value) or ()]
        missing = _missing(expected, view.words(knob))
        findings.append(failed(f"schedd {knob}", f"lacks {' '.join(missing)}", fix) if missing
                        else passed(f"schedd {knob}", f"has the {len(expected)} of {SCHEDD_SNIPPET}"))
    names = [w for name, value in shipped if name == "JOB_TRANSFORM_NAMES" for w in appended_words(name, value) or ()]
    bodies = dict(shipped)
    for transform in names:
        knob = f"JOB_TRANSFORM_{transform}"
        body = view.knob(knob)
        if body is None:
            findings.append(failed(f"schedd transform {knob}", "not defined", fix))
            continue
        sets = re.findall(r"^\s*SET\s+(\w+)", bodies.get(knob, ""), re.MULTILINE | re.IGNORECASE)
        missing = _missing(sets, re.findall(r"^\s*SET\s+(\w+)", body, re.MULTILINE | re.IGNORECASE))
        findings.append(failed(f"schedd transform {knob}", f"does not SET {' '.join(missing)} (an older "
                               f"{SCHEDD_SNIPPET}?)", fix) if missing else passed(f"schedd transform {knob}"))
    offers = text.partition(OFFER_HEADING)[2]
    for knob, raw in snippet_assignments(offers):
        findings.append(_offer_finding(view, knob, raw, fix))
    return findings


def _offer_finding(view: HostView, knob: str, raw: str, fix: str) -> Finding:
    """A knob of the offer section at least (numbers) or exactly (text) the snippet's value here."""
    expected, configured = view.expand(raw), view.knob(knob)
    what = f"schedd offers {knob}"
    if expected.isdigit() and configured is not None and configured.isdigit():
        if int(configured) >= int(expected):
            return passed(what, f"= {configured}")
        return failed(what, f"is {configured}, below the {expected} that {SCHEDD_SNIPPET} sets ({knob} = {raw}): "
                      "pins beyond it per submitter wait for later negotiation cycles", fix)
    if configured is not None and configured.casefold() == expected.casefold():
        return passed(what, f"= {configured}")
    return failed(what, f"is {configured or 'unset'}, {SCHEDD_SNIPPET} sets {knob} = {raw} ({expected} here)", fix)


# ---- execute nodes --------------------------------------------------------------------

def is_cosched_node(view: HostView) -> bool:
    """A startd whose START names condor_sched's policy (config.d/20), or with a node config."""
    return "cosched" in (view.knob("START") or "").casefold() or os.path.lexists(view.node_config_path)


def check_execute_knobs(view: HostView) -> list[Finding]:
    """The startd and execute snippets' knobs on a condor_sched node (20: START, 30: hook, cron, agent)."""
    findings = []
    if "cosched" not in (view.knob("START") or "").casefold():
        findings.append(failed("execute START", f"does not include condor_sched's policy, but {view.node_config_path} "
                               "exists: device slots would run any job, unpinned",
                               install_fix(STARTD_SNIPPET, "this execute node")))
    assignments = snippet_assignments(view.snippet(EXECUTE_SNIPPET))
    shipped = dict(assignments)
    appended: dict[str, list[str]] = {}
    for name, value in assignments:
        appended.setdefault(name, []).extend(_expanded_words(view, appended_words(name, value) or ()))
    fix = install_fix(EXECUTE_SNIPPET, "this execute node")
    for knob in EXECUTE_KNOBS:
        what, value = f"execute {knob}", view.knob(knob)
        if appended.get(knob):
            missing = _missing(appended[knob], view.words(knob))
            findings.append(failed(what, f"lacks {' '.join(missing)}", fix) if missing
                            else passed(what, f"has {' '.join(appended[knob])}"))
        elif "$(" in shipped.get(knob, "$("):
            findings.append(passed(what, f"= {value}") if value else failed(what, "not set", fix))
        elif (value or "").casefold() != shipped[knob].casefold():
            findings.append(failed(what, f"is {value or 'unset'}, {EXECUTE_SNIPPET} sets {shipped[knob]}", fix))
        else:
            findings.append(passed(what, f"= {value}"))
    return findings


def _expanded_words(view: HostView, words: Iterable[str]) -> list[str]:
    """``words`` with each ``$(NAME:default)`` replaced by this host's NAME (else the default):
    30's DAEMON_LIST names ``$(COSCHED_NODE_AGENTS:COSCHED_NODE_AGENT)``, one agent per startd."""
    out: list[str] = []
    for word in words:
        macro = _MACRO.fullmatch(word)
        out.extend((view.words(macro["name"]) or (macro["default"] or "").split()) if macro else [word])
    return out


def _hardware_role(config: NodeConfig) -> str:
    """The role a config describes, so ``describe.differences`` compares the devices it offers."""
    if config.gpus:
        return "gpu"
    if config.devices:
        return "device"
    return "node-sharing" if config.node_slot else "socket"


def check_node_config(view: HostView) -> tuple[NodeConfig | None, list[Finding]]:
    """The node config is valid (the node side's validator), for this node, and matches the hardware."""
    path = view.node_config_path
    describe_node = f"python3 {view.node_hooks}/cosched_describe_node.py"
    rewrite = (f"write it here, as root: {describe_node} --output {path} (docs/node-config.md), then "
               f"python3 {view.node_hooks}/discover_devices.py --output /etc/condor/config.d/31-cosched-slots.conf "
               "and condor_restart -startd")
    if view.local_name:
        rewrite = (f"write it here, as root: {describe_node} --overrides <its overrides> --output {path}, then the "
                   "slots of every startd of the host: the block of docs/admin.md, 'Several startds on one host'")
    what = f"node config {path}"
    if not os.path.lexists(path):
        return None, [failed(what, "missing: the hook, the startd cron and the node agent refuse to run", rewrite)]
    try:
        config = load_node_config(path)
    except ValueError as e:   # ConfigError
        return None, [failed(what, f"invalid: {e}", rewrite)]
    if config.node.lower() not in view.short_names:
        return config, [failed(what, f"is for node {config.node!r}, this host is "
                               f"{' / '.join(sorted(view.short_names))} (FULL_HOSTNAME, STARTD_NAME)",
                               f"copy this node's own config there, or {rewrite}")]
    role = _hardware_role(config)
    try:
        found = hardware.probe_hardware(view.hardware_root, view.nvidia_smi if role == "gpu" else hardware.SKIP,
                                        None, view.micinfo if role in ("device", "node-sharing") else hardware.SKIP,
                                        lambda _message: None)
    except ValueError as e:   # HardwareError, GpuError
        return config, [failed(f"{what} against the hardware", f"cannot probe the hardware: {e}",
                               f"run {describe_node} --check {path} to see the probe's error")]
    differences = describe.differences(config, found, describe.Overrides(role=role))
    if differences:
        return config, [failed(what, "does not match this host's hardware: " + "; ".join(differences),
                               f"if it was written with --overrides (reserved cores or memory), compare with "
                               f"{describe_node} --check {path} --overrides FILE; else {rewrite}")]
    return config, [passed(what, f"valid, for {config.node}, matches the hardware")]


def _hook_path_problems(real: str) -> list[tuple[str, str]]:
    """(problem, fix) of the hook file and each directory above it: job users are arbitrary
    accounts, so others must read and run it, and only root may change it."""
    problems = []
    info = os.stat(real)
    if not stat.S_ISREG(info.st_mode):
        return [(f"{real} is not a regular file", "install the node programs: condor-sched install-node")]
    if info.st_uid != 0:
        problems.append((f"{real} is owned by uid {info.st_uid}, not root", f"chown root:root {real}"))
    if info.st_mode & 0o005 != 0o005 or info.st_mode & 0o022:
        problems.append((f"{real} must be readable and executable by others and writable by neither group nor "
                         f"others ({describe_stat(info)})", f"chmod 755 {real}"))
    for directory in directories_above(real):
        dir_info = os.stat(directory)
        sticky_root = dir_info.st_uid == 0 and dir_info.st_mode & stat.S_ISVTX
        if dir_info.st_uid != 0 or (dir_info.st_mode & 0o022 and not sticky_root):
            problems.append((f"directory {directory} is not root's alone ({describe_stat(dir_info)})",
                             f"chown root {directory} && chmod go-w {directory}"))
        if not dir_info.st_mode & 0o001:
            problems.append((f"others cannot search directory {directory} ({describe_stat(dir_info)})",
                             f"chmod o+x {directory}"))
    interpreter = shebang_interpreter(real)
    if interpreter is not None:
        try:
            runnable = bool(os.stat(interpreter).st_mode & 0o001)
        except OSError:
            runnable = False
        if not runnable:
            problems.append((f"its interpreter {interpreter or '(none)'} is missing or not executable by others",
                             "install the node's system python3 there, or reinstall the node programs"))
    return problems


def check_prepare_hook(view: HostView) -> list[Finding]:
    """COSCHED_HOOK_PREPARE_JOB is a root-owned file any job user can read and run."""
    path = view.knob("COSCHED_HOOK_PREPARE_JOB")
    if path is None:
        return []   # reported with the execute snippet's knobs
    what = f"PREPARE_JOB hook COSCHED_HOOK_PREPARE_JOB = {path}"
    try:
        problems = _hook_path_problems(os.path.realpath(path))
    except OSError as e:
        return [failed(what, e.strerror or str(e), f"copy the node programs to {os.path.dirname(path)} "
                       "(condor-sched install-node, as root) or fix COSCHED_NODE_HOOKS")]
    if not problems:
        return [passed(what, "root's, readable and executable by every job user")]
    return [failed(what, "the job's user (any account) must run it and no one but root change it: "
                   + "; ".join(p for p, _ in problems), "; ".join(dict.fromkeys(f for _, f in problems)))]


def check_node_agent(view: HostView, config: NodeConfig) -> list[Finding]:
    """The node agent's heartbeat in its state dir is fresher than :data:`HEARTBEAT_MAX_AGE_S`."""
    try:
        state_dir = state_dir_for(config)
    except ValueError as e:
        return [failed("node agent state dir", str(e), "fix state_dir in the node config")]
    beat_path = os.path.join(state_dir, node_state.HEARTBEAT_NAME)
    agent = f"COSCHED_NODE_AGENT_{view.local_name}" if view.local_name else "COSCHED_NODE_AGENT"
    fix = (f"condor_on -daemon {agent} (DAEMON_LIST must name it), then read {state_dir}/agent.log "
           "and the MasterLog for why it stopped")
    beat = node_state.read_json(state_dir, node_state.HEARTBEAT_NAME)
    beat_time = beat.get("time") if isinstance(beat, dict) else None
    if isinstance(beat_time, bool) or not isinstance(beat_time, (int, float)):
        return [failed(f"node agent heartbeat {beat_path}", "missing or unreadable: the node agent is not running",
                       fix)]
    age = view.clock() - beat_time
    if not 0 <= age <= HEARTBEAT_MAX_AGE_S:
        when = f"{age:.0f} s old" if age > 0 else f"{-age:.0f} s in the future"
        return [failed(f"node agent heartbeat {beat_path}", f"{when} (limit {HEARTBEAT_MAX_AGE_S:.0f} s): the node "
                       "agent is dead or hung; the sidecar plans nothing here", fix)]
    return [passed(f"node agent heartbeat {beat_path}", f"{age:.0f} s old")]


def installed_node_version(view: HostView) -> tuple[str, str | None] | None:
    """(file, version) of this host's node programs (``__version__`` of their package, read as
    text: never a second copy imported); version None when the file has none. None: not installed."""
    hooks = view.knob("COSCHED_NODE_HOOKS")
    if hooks is None:
        return None
    path = os.path.join(hooks, "cosched_node", "__init__.py")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(65536)
    except OSError:
        return None
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return path, found[1] if found else None
