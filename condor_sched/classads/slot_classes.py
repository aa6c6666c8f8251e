"""Probe targets in classes of slots that give a probe job the same answer
(:class:`_SlotClasses`), so HTCondor's matchmaking is evaluated once per class instead of
once per slot (issue 11: 10k slots), and the match of one slot of each class
(``_classes_accepting``)."""
from __future__ import annotations

from typing import Callable, Hashable, Iterable

import classad2

from condor_sched.classads.jobs import _strip_parentheses, _top_level_conjuncts
from condor_sched.classads.plain import _classad_of, _lookup_text
from condor_sched.classads.references import _LITERAL, _ad_of_reads, _direct_refs, _reads_in, _text_and_refs
from condor_sched.model import PIN_SLOT_ATTR, PIN_TIME_ATTR


def _classes_accepting(groups: list[list[int]], targets: list[tuple[str, classad2.ClassAd]],
                       probe: classad2.ClassAd, match: Callable[[classad2.ClassAd], bool]) -> list[list[int]]:
    """The classes of ``groups`` whose first member ``match``es ``probe`` pinned to it."""
    accepted = []
    for members in groups:
        name, target = targets[members[0]]
        probe[PIN_SLOT_ATTR] = name
        try:
            if match(_classad_of(target)):
                accepted.append(members)
        except Exception:  # a hostile expression matches nothing, as in HTCondor
            pass
    return accepted


#: config.d/20's COSCHED_PINNED_HERE as classad2 prints it: the only place its START reads the
#: slot's Name, compared with the pin the probe sets to that very Name.
_PINNED_HERE = str(classad2.ExprTree(
    r'TARGET.CoSchedPinSlot =?= regexps("^(slot[0-9]+)(_[0-9]+)?(@.*)", MY.Name, "\\1\\3")'))
#: References after which a slot is its own class: its name, the pin (set to that name), and
#: ``eval``-like functions that read attributes no reference names.
_NAME_REFS = {"name", "my.name", PIN_SLOT_ATTR.lower(), f"my.{PIN_SLOT_ATTR.lower()}",
              f"target.{PIN_SLOT_ATTR.lower()}"}


class _SlotClasses:
    """Probe targets (``eligibility.eligible_slots``) in classes whose every member gives a probe job the
    same answer: equal in START's text once its pin clause (``_PINNED_HERE``, whose value for a
    probe pinned to the slot is known per slot) is replaced by that value, and in the text of
    every slot attribute START and the probe job read (followed through expressions). A slot
    whose START still reads its Name or the pin, or calls an ``eval`` function, is a class of
    its own, as is every slot for a job that reads its own pin; HTCondor's matchmaking is then
    evaluated once per class instead of once per slot (issue 11: 10k slots)."""

    def __init__(self, targets: list[tuple[str, classad2.ClassAd]]):
        self.targets = targets
        self._values: dict[tuple[int, str], tuple[str, tuple[str, ...]]] = {}
        self._partitions: dict[tuple[frozenset[str], bool], list[list[int]]] = {}
        self._reads: dict[Hashable, frozenset[str] | None] = {}
        self._names: dict[tuple[int, ...], frozenset[str]] = {}
        self._singletons = [[i] for i in range(len(targets))]
        self._pinned_here = classad2.ExprTree(_PINNED_HERE)
        self._both: dict[tuple[int, int], frozenset[str]] = {}
        self._operands: dict[tuple[str, tuple[tuple[str, str], ...]], frozenset[str]] = {}
        self.start = [self._start_key(i) for i in range(len(targets))]
        self.start_reads = self._start_job_reads()
        self._start_groups: list[list[int]] | None = None
        self._start_memo: dict[tuple, frozenset[str]] = {}

    def _start_job_reads(self) -> frozenset[str] | None:
        """The job attributes (lower case) any slot's START reads (``TARGET.X``, and unqualified
        names the slot lacks); None when a START calls an ``eval`` function or does not parse."""
        reads: set[str] = set()
        for texts in {_reads_in(target, ["requirements"], values=False) for _, target in self.targets}:
            try:
                ad = _ad_of_reads(texts)
                expr = ad.lookup("Requirements")
                refs = ad.externalRefs(expr)
            except Exception:
                return None
            if "eval" in str(expr).lower():
                return None
            for ref in refs:
                lower = ref.lower()
                if lower.startswith("target."):
                    reads.add(lower[7:].split(".", 1)[0])
                elif "." not in lower:
                    reads.add(lower)
        return frozenset(reads)

    def start_accepting(self, probe: classad2.ClassAd, values: Iterable[tuple[str, str]],
                        requirements: str) -> frozenset[str] | None:
        """The names of the slots whose START accepts ``probe`` pinned to them, evaluated once
        per class of equal START (``start``) and memoised on the values of the job attributes
        START reads; None when that cannot be known (``start_reads`` is None)."""
        if self.start_reads is None:
            return None
        key = (tuple((r.lower(), v) for r, v in values if r.lower() in self.start_reads),
               requirements if "requirements" in self.start_reads else None)
        if key not in self._start_memo:
            if self._start_groups is None:
                classes: dict[Hashable, list[int]] = {}
                for i in range(len(self.targets)):
                    classes.setdefault(("own", i) if self.start[i] is None else self.start[i], []).append(i)
                self._start_groups = list(classes.values())
            accepted = _classes_accepting(self._start_groups, self.targets, probe, probe.matches)
            self._start_memo[key] = self.names(self._start_groups, accepted)
        return self._start_memo[key]

    def _start_key(self, i: int) -> tuple | None:
        """Slot ``i``'s START with its pin clause's value, and what it reads of the slot."""
        name, target = self.targets[i]
        if not isinstance(name, str):
            return None
        try:
            text = _lookup_text(target, "Requirements")
            if _PINNED_HERE in text:  # reads the slot's Name alone: evaluated on an ad of it
                pinned = classad2.ClassAd({PIN_SLOT_ATTR: name})
                name_ad = classad2.ClassAd({a: classad2.ExprTree(t) for a, t in _reads_in(target, ["name"])})
                here = self._pinned_here.eval(name_ad, pinned)
                if not isinstance(here, bool):
                    return None
                text = text.replace(_PINNED_HERE, "true" if here else "false")
            if "eval" in text.lower():
                return None
            refs = _direct_refs(text)
        except Exception:
            return None
        if any(r.lower() in _NAME_REFS for r in refs):
            return None
        reads = self._closure(i, _slot_side(refs))
        return None if reads is None else (text, reads)

    def _value(self, i: int, attr: str) -> tuple[str, tuple[str, ...] | None]:
        """Slot ``i``'s ``attr`` as text ("" when absent), and the slot attributes it reads when
        an expression; None when it reads the slot's Name or the pin, or calls an ``eval``
        function (it reads what no reference names)."""
        key = (i, attr)
        if key not in self._values:
            read = _text_and_refs(self.targets[i][1], attr)
            if read is None:
                self._values[key] = ("", ())
            else:
                text, refs = read
                if "eval" in text.lower() or any(r.lower() in _NAME_REFS for r in refs):
                    self._values[key] = (text, None)
                else:
                    self._values[key] = (text, tuple(_slot_side(refs)))
        return self._values[key]

    def _closure(self, i: int, attrs: Iterable[str]) -> tuple[tuple[str, str], ...] | None:
        """The text of every attribute of slot ``i`` that reading ``attrs`` reads; None when it
        reads its Name or the pin."""
        seen: dict[str, str] = {}
        todo = list(attrs)
        while todo:
            attr = todo.pop()
            if attr in seen:
                continue
            if attr in _NAME_REFS:
                return None
            seen[attr], refs = self._value(i, attr)
            if refs is None:
                return None
            todo += refs
        return tuple(sorted(seen.items()))

    def partition(self, probe: classad2.ClassAd, signature: Hashable, with_start: bool = True) -> list[list[int]]:
        """Indices of the targets in classes that answer ``probe`` alike (pin aside), a list kept
        as long as this object: in the probe's Requirements and the slot's START, or
        (``with_start`` false) in the probe's Requirements alone. ``signature``: equal for
        probes whose expressions read the same (``eligibility._accepting``)."""
        if signature not in self._reads:
            self._reads[signature] = self._slot_reads(probe)
        attrs = self._reads[signature]
        if attrs is None:
            return self._singletons
        if (attrs, with_start) not in self._partitions:
            classes: dict[tuple, list[int]] = {}
            for i in range(len(self.targets)):
                reads = None if with_start and self.start[i] is None else self._closure(i, attrs)
                own = ("own", i) if reads is None else (self.start[i] if with_start else None, reads)
                classes.setdefault(own, []).append(i)
            self._partitions[(attrs, with_start)] = list(classes.values())
        return self._partitions[(attrs, with_start)]

    def requirements_accepting(self, requirements: str, values: Iterable[tuple[str, str]]) -> frozenset[str]:
        """The names of the slots that a probe job of ``requirements`` and ``values`` (job
        attributes' texts) pinned to them matches, the job's side only. Each operand of the
        top-level ``&&`` is evaluated apart, once per class of slots and memoised on its text and
        the job attributes it reads: ``A && B`` is true only when both are (false, undefined or
        error make it not true), so the slots it accepts are the intersection. A queue's jobs
        differ in a few operands (the request sizes); the file system clause of
        ``should_transfer_files = IF_NEEDED``, which makes every node a class of its own, then
        is evaluated once per file system domain of the jobs, not per job shape."""
        by_name = {r.lower(): (r, v) for r, v in values}
        parts = _top_level_conjuncts(_strip_parentheses(requirements)) or [requirements]
        reads = [_job_attributes_read(part, by_name) for part in parts]
        if len(parts) == 1 or None in reads:  # one operand, or one reads the Requirements: the whole
            parts, reads = [requirements], [tuple(sorted(values))]
        accepted: frozenset[str] | None = None
        for part, read in zip(parts, reads):
            key = (part, read)
            if key not in self._operands:
                probe = classad2.ClassAd()
                for r, value in read:
                    probe[r] = classad2.ExprTree(value)
                probe["Requirements"] = classad2.ExprTree(part)
                probe[PIN_TIME_ATTR] = classad2.ExprTree("time()")
                signature = (part, tuple(r.lower() for r, _ in read),
                             tuple((r.lower(), v) for r, v in read if not _LITERAL.fullmatch(v)))
                groups = self.partition(probe, signature, with_start=False)
                matched = _classes_accepting(groups, self.targets, probe, lambda target: target.matches(probe))
                self._operands[key] = self.names(groups, matched)
            accepted = self._operands[key] if accepted is None else self.both(accepted, self._operands[key])
        assert accepted is not None
        return accepted

    def both(self, first: frozenset[str], second: frozenset[str]) -> frozenset[str]:
        """``first & second`` of sets this object keeps (``names``, ``start_accepting``), each
        intersection made once."""
        key = (id(first), id(second))
        if key not in self._both:
            self._both[key] = first & second
        return self._both[key]

    def names(self, partition: list[list[int]], classes: list[list[int]]) -> frozenset[str]:
        """The names of the targets in ``classes`` of ``partition`` (a list ``partition`` gave,
        kept as long as this object), each union made once."""
        key = (id(partition), *(members[0] for members in classes))
        if key not in self._names:
            self._names[key] = frozenset(self.targets[i][0] for members in classes for i in members)
        return self._names[key]

    def _slot_reads(self, probe: classad2.ClassAd) -> frozenset[str] | None:
        """The slot attributes ``probe``'s expressions read; None when they read the slot's
        name or the pin, or call an ``eval`` function (then every slot is its own class)."""
        try:
            exprs = [probe.lookup(a) for a in probe.keys() if a.lower() != PIN_SLOT_ATTR.lower()]
            reads = [r for e in exprs for r in (*probe.internalRefs(e), *probe.externalRefs(e))]
            texts = " ".join(str(e) for e in exprs).lower()
        except Exception:
            return None
        if "eval" in texts or any(r.lower() in _NAME_REFS for r in reads):
            return None
        present = {a.lower() for a in probe.keys()}
        return frozenset(a for r in reads for a in _slot_side([r], present))


def _job_attributes_read(expression: str, values: dict[str, tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """Of ``values`` (a job's attributes by lower-case name: name, text), those ``expression``
    reads (``MY.X`` and unqualified references, followed through their texts), in name order;
    None when it reads the job's Requirements."""
    seen: dict[str, tuple[str, str]] = {}
    todo = [expression]
    while todo:
        for ref in _direct_refs(todo.pop()):
            lower = ref.lower()
            if lower.startswith("target."):
                continue
            attr = lower.removeprefix("my.").split(".", 1)[0]
            if attr == "requirements":
                return None
            if attr in values and attr not in seen:
                seen[attr] = values[attr]
                todo.append(values[attr][1])
    return tuple(sorted(seen.values()))


def _slot_side(refs: Iterable[str], probe_attrs: set[str] | None = None) -> list[str]:
    """The slot attributes (lower case) among references: ``TARGET.X`` from a job's side,
    ``MY.X`` and unqualified ones from the slot's side (``probe_attrs`` given: a job's
    unqualified references that the probe job lacks, which HTCondor looks up in the slot)."""
    out = []
    for ref in refs:
        lower = ref.lower()
        if not lower:
            continue
        if probe_attrs is None:
            if lower.startswith("target."):
                continue
            out.append(lower.removeprefix("my.").split(".", 1)[0])
        elif lower.startswith("target."):
            out.append(lower[7:].split(".", 1)[0])
        elif "." not in lower and lower not in probe_attrs:
            out.append(lower)
    return out
