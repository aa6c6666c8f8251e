"""What an expression reads: the references an expression's text makes (``_direct_refs``),
an attribute's text and references (``_text_and_refs``), the attributes that evaluating
some attributes of an ad reads (``_reads_in``, and an ad of just those: ``_ad_of_reads``),
the attributes an expression may read from a job ad (``_own_references``), and the job
attributes the slots' START read (:func:`start_references`)."""
from __future__ import annotations

import re
from typing import Any, Iterable

import classad2

from condor_sched.classads.plain import _MAX_CACHED, _PlainAd, _check_cost, _classad_of
from condor_sched.expression_cost import names_read


def _start_refs(slot_ad: classad2.ClassAd | _PlainAd) -> set[str]:
    """``start_references`` of one slot; of a snapshot's slot, found once per text of START and
    of every slot attribute it reads (:func:`_reads_in`), on an ad of just those."""
    if slot_ad.__class__ is not _PlainAd or slot_ad.live or "Start" not in slot_ad or slot_ad.is_literal("Start"):
        return start_references([slot_ad])
    texts = _reads_in(slot_ad, ["start"], values=False)
    refs = _START_REFS.get(texts)
    if refs is None:
        refs = frozenset(start_references([_ad_of_reads(texts)]))
        if len(_START_REFS) < _MAX_CACHED:
            _START_REFS[texts] = refs
    return set(refs)


_START_REFS: dict[tuple[tuple[str, str], ...], frozenset[str]] = {}


def _own_references(ad: classad2.ClassAd, expr: classad2.ExprTree) -> set[str]:
    """The attributes ``expr`` may read from a job ad: ``MY.`` ones and every unqualified one
    (HTCondor looks those up in the job first). Independent of which of them ``ad`` has, so
    it can be kept per expression."""
    refs = set(ad.internalRefs(expr))
    for ref in ad.externalRefs(expr):
        if ref.lower().startswith("my."):
            refs.add(ref[3:])
        elif "." not in ref:
            refs.add(ref)
    return refs


def _own_references_of(ad: classad2.ClassAd | _PlainAd, attr: str) -> set[str]:
    """``_own_references`` of ``attr``'s expression in ``ad``; of one that reads itself round,
    whose references classad2 cannot tell, found by following each attribute's text."""
    _check_cost(ad, (attr,))
    full = _classad_of(ad)
    try:
        return _own_references(full, full.lookup(attr))
    except ValueError:
        pass
    refs: dict[str, str] = {}
    todo = [attr]
    while todo:
        read = _text_and_refs(ad, todo.pop())
        for ref in read[1] if read else ():
            name = ref[3:] if ref.lower().startswith("my.") else ref
            if "." not in name and name.lower() not in refs:
                refs[name.lower()] = name
                todo.append(name)
    return set(refs.values())


def start_references(slot_ads: Iterable[classad2.ClassAd]) -> set[str]:
    """The job attributes the slots' START expressions read (``TARGET.`` ones): a live
    query must project on them for :func:`eligibility.eligible_slots` to judge START."""
    refs: set[str] = set()
    for ad in slot_ads:
        if ad.__class__ is _PlainAd:
            if "Start" not in ad or ad.is_literal("Start"):
                continue
            ad = ad.classad
        if "Start" in ad:
            try:
                refs |= {r[7:] for r in ad.externalRefs(ad.lookup("Start")) if r.lower().startswith("target.")}
            except Exception:  # a START that does not parse refers to nothing
                continue
    return refs


#: A ClassAd literal as classad2 prints it (a value that reads no attribute).
_LITERAL = re.compile(r'-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|"(?:[^"\\]|\\.)*"|true|false|undefined|error',
                      re.IGNORECASE)


#: Each expression's text (as classad2 prints it) and the references it makes, not followed
#: through any ad (``_direct_refs``); ads of a few attributes by their texts (``_ad_of_reads``).
_DIRECT_REFS: dict[str, tuple[str, ...]] = {}
_READS_ADS: dict[tuple[tuple[str, str], ...], classad2.ClassAd] = {}
_NO_AD = classad2.ClassAd()
_RAW_TEXT_REFS: dict[tuple[type, Any], tuple[str, tuple[str, ...]]] = {}


def _direct_refs(text: str) -> tuple[str, ...]:
    """The references (``X``, ``MY.X``, ``TARGET.X``, ``X.Y``) an expression's text makes."""
    refs = _DIRECT_REFS.get(text)
    if refs is None:
        try:
            refs = tuple(r for r in _NO_AD.externalRefs(classad2.ExprTree(text)) if r)
        except ValueError:  # it reads itself round (a nested ad): every name it may read, unscoped
            refs = names_read(text)
        if len(_DIRECT_REFS) < _MAX_CACHED:
            _DIRECT_REFS[text] = refs
    return refs


def _text_and_refs(ad: classad2.ClassAd | _PlainAd, attr: str) -> tuple[str, tuple[str, ...]] | None:
    """``attr`` of ``ad`` as ClassAd text and the references it makes (none for a plain value);
    None when ``ad`` lacks it. Of a snapshot's ad, found once per JSON value."""
    if ad.__class__ is _PlainAd:
        name = ad.names.get(attr.lower())
        if name is None:
            return None
        raw = ad.values[name]
        key = (raw.__class__, raw)  # True == 1 == 1.0, but their texts differ
        try:
            read = _RAW_TEXT_REFS.get(key)
        except TypeError:  # a list or a nested ad
            key = read = None
        if read is None:
            text = ad.lookup_text(attr)
            read = text, () if ad.is_literal(attr) else _direct_refs(text)
            if key is not None and not ad.live and len(_RAW_TEXT_REFS) < _MAX_CACHED:
                _RAW_TEXT_REFS[key] = read
        return read
    if attr not in ad:
        return None
    value = ad.get(attr)
    text = str(ad.lookup(attr))
    return text, () if isinstance(value, (str, int, float, bool)) or value is None else _direct_refs(text)


def _reads_in(ad: classad2.ClassAd | _PlainAd, attrs: Iterable[str],
              values: bool = True) -> tuple[tuple[str, str], ...]:
    """The text of every attribute of ``ad`` that evaluating ``attrs`` in it reads (lower-case
    names; ``MY.X`` and unqualified references followed through expressions): an ad of just
    these (``_ad_of_reads``) evaluates ``attrs`` as ``ad`` does. ``values`` false: plain values
    shown as 0, enough to tell the references ``attrs`` make (each slot's Name is its own)."""
    seen: dict[str, str] = {}
    todo = list(attrs)
    while todo:
        attr = todo.pop()
        if attr in seen:
            continue
        read = _text_and_refs(ad, attr)
        if read is None:
            continue
        seen[attr] = read[0] if values or read[1] or not _LITERAL.fullmatch(read[0]) else "0"
        todo += (r.lower().removeprefix("my.").split(".", 1)[0] for r in read[1] if not r.lower().startswith("target."))
    return tuple(sorted(seen.items()))


def _ad_of_reads(texts: tuple[tuple[str, str], ...]) -> classad2.ClassAd:
    """A ClassAd of ``_reads_in``'s attributes, built once per texts."""
    ad = _READS_ADS.get(texts)
    if ad is None:
        ad = classad2.ClassAd({attr: classad2.ExprTree(text) for attr, text in texts})
        if len(_READS_ADS) < _MAX_CACHED:
            _READS_ADS[texts] = ad
    return ad
