"""YAML documents of plain data (mappings, lists, numbers, text) loaded fast, with exactly
``yaml.safe_load``'s result.

PyYAML's safe loader builds a node per value and resolves each scalar through a list of
regular expressions in Python: a 100k-request workload (16 MiB) took over a minute even
with libyaml's parser. Here libyaml's events are folded into Python objects directly; a
plain scalar that is a decimal integer without a leading zero (nearly every value of a
workload) is ``int``'d, any other scalar goes through PyYAML's own resolver and
constructor, and a document with anchors, aliases, explicit tags, merge keys or more
than one document is handed to ``yaml.safe_load`` whole, so nothing reads differently.
Only the safe constructor ever runs: no tag constructs an object.
"""
from __future__ import annotations

import re

import yaml

_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Fallback(Exception):
    """A construct the fast path leaves to ``yaml.safe_load``."""


def load(text: str):
    """``yaml.safe_load(text)``, fast for plain data; raises what it raises."""
    try:
        return _fold(yaml.parse(text, Loader=_LOADER))
    except _Fallback:
        return yaml.load(text, Loader=_LOADER)


def _scalar(ev) -> object:
    value = ev.value
    if ev.tag is not None and ev.tag != "!":
        raise _Fallback()
    if ev.implicit[0]:          # plain: resolved by its form
        if _DECIMAL.match(value):
            return int(value)
        tag = _resolver.resolve(yaml.ScalarNode, value, (True, False))
    else:                       # quoted: text
        return value
    if tag == "tag:yaml.org,2002:str":
        return value
    construct = _CONSTRUCTORS.get(tag)
    if construct is None:       # merge keys, value keys: safe_load's own handling
        raise _Fallback()
    return construct(_constructor, yaml.ScalarNode(tag, value))


def _fold(events):
    """The document of ``events`` (one document, no anchors or aliases)."""
    stack: list = []          # [container, pending key or _NO_KEY]
    root = _NO_KEY
    docs = 0
    decimal = _DECIMAL.match
    Scalar, MapStart, SeqStart = yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent
    MapEnd, SeqEnd, Alias, DocStart = (yaml.MappingEndEvent, yaml.SequenceEndEvent,
                                       yaml.AliasEvent, yaml.DocumentStartEvent)
    for ev in events:
        kind = type(ev)
        if kind is Scalar:
            if ev.anchor is not None:
                raise _Fallback()
            value = ev.value
            if ev.tag is None and ev.implicit[0] and decimal(value):
                value = int(value)     # most values of a workload or a repro
            else:
                value = _scalar(ev)
        elif kind is MapStart or kind is SeqStart:
            if ev.anchor is not None or (ev.tag is not None and ev.tag != "!"):
                raise _Fallback()
            stack.append([{} if kind is MapStart else [], _NO_KEY])
            continue
        elif kind is MapEnd or kind is SeqEnd:
            value = stack.pop()[0]
        elif kind is Alias:
            raise _Fallback()
        elif kind is DocStart:
            docs += 1
            if docs > 1:
                raise _Fallback()      # safe_load's own error for several documents
            continue
        else:                          # stream and document ends
            continue
        if not stack:
            root = value
            continue
        top = stack[-1]
        container = top[0]
        if type(container) is list:
            container.append(value)
        elif top[1] is _NO_KEY:
            try:
                hash(value)
            except TypeError:
                raise _Fallback() from None   # safe_load's own error for such a key
            top[1] = value
        else:
            container[top[1]] = value
            top[1] = _NO_KEY
    return None if root is _NO_KEY else root


_NO_KEY = object()
_resolver = yaml.resolver.Resolver()
_constructor = yaml.constructor.SafeConstructor()
# the safe constructor's scalar constructors (none keeps state between calls)
_CONSTRUCTORS = {tag: fn for tag, fn in yaml.constructor.SafeConstructor.yaml_constructors.items()
                 if tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:bool",
                            "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                            "tag:yaml.org,2002:timestamp")}
