"""The engine's events and snapshots build as the frozen dataclasses they are: their
fast ``__init__`` (``events._dict_init``: fields stored into the instance dict) takes
the same parameters and defaults and gives the same, still frozen, values."""
import dataclasses
import pickle

import pytest

from overlapcheck.protocol import events as E

CLASSES = [c for c in vars(E).values()
           if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == E.__name__]


def test_every_event_class_has_the_fast_init():
    assert len(CLASSES) >= 25
    for cls in CLASSES:
        assert "__setattr__" not in cls.__init__.__code__.co_names, cls


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_fast_init_matches_the_dataclass(cls):
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING]
    values = {f.name: (i, f.name) for i, f in enumerate(fields)}
    a = cls(*values.values())
    b = cls(**values)
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert dataclasses.asdict(a) == values
    assert vars(a) == values
    # defaults: only the required fields given
    c = cls(*(values[f.name] for f in required))
    for f in fields:
        assert getattr(c, f.name) == (values[f.name] if f in required else f.default)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(a, fields[0].name, 0)
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(TypeError):
        cls(*values.values(), 0)       # one argument too many
    if required:
        with pytest.raises(TypeError):
            cls(*(values[f.name] for f in required[:-1]))
