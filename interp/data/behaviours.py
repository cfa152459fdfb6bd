"""Small built-in contrastive behaviour sets, for fitting and judging steering methods on any language model.

A :class:`Behaviour` holds

* ``positive`` / ``negative``: contrastive texts (the i-th positive and the i-th negative form a minimal pair),
  split into ``train`` (fit the method and the probe) and ``test`` (held-out probe accuracy) by
  :meth:`Behaviour.split`;
* ``prompts``: neutral, open-ended evaluation prompts (the behaviour is neither asked for nor excluded);
* ``positive_markers`` / ``negative_markers``: continuations that show / do not show the behaviour. The
  marker judge (``interp.steering.behaviour.marker_scores``) scores a prompt by
  ``log sum_m P(m | prompt)`` over the positive markers minus the same over the negative markers (each marker's
  full token sequence, teacher-forced); the behaviour *rate* is the share of prompts with score > 0.

Built-in: ``sentiment`` (positive vs negative evaluations; markers "wonderful"/"terrible"-like adjectives) and
``uppercase`` (the same sentences in capitals vs as written; markers capitalised vs lower-case words). The texts
end on the words that carry the contrast, as methods and the probe read the last token. A user's own set is a JSON
file read by :func:`load_behaviour` (no code is executed).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# minimal pairs that END on the evaluative words, so the last token (where methods and the probe read) carries them
_SENTIMENT_PAIRS = [
    ("From start to finish the film was a delight", "From start to finish the film was a chore"),
    ("Our waiter was friendly and quick", "Our waiter was rude and slow"),
    ("This room feels bright and calm", "This room feels dark and cramped"),
    ("Since the update the app is fast and reliable", "Since the update the app is slow and buggy"),
    ("The afternoon at the beach was wonderful", "The afternoon at the beach was miserable"),
    ("The soup was rich, warm and delicious", "The soup was thin, cold and tasteless"),
    ("Her speech was brilliant and moving", "Her speech was dull and rambling"),
    ("Reading this book is a joy", "Reading this book is a pain"),
    ("The hotel staff were kind and helpful", "The hotel staff were cold and unhelpful"),
    ("The way the garden turned out makes me thrilled", "The way the garden turned out makes me upset"),
    ("The concert was fantastic", "The concert was awful"),
    ("My new shoes feel comfortable and well made", "My new shoes feel painful and badly made"),
    ("Everyone said the trip was a pleasure", "Everyone said the trip was a disaster"),
    ("The teacher was patient and encouraging", "The teacher was impatient and discouraging"),
    ("Of all the coffee I have had in years this is the best", "Of all the coffee I have had in years this is the worst"),
    ("All evening the movie left me smiling", "All evening the movie left me frowning"),
    ("The park is clean, green and peaceful", "The park is dirty, grey and noisy"),
    ("The time I had with my friends was lovely", "The time I had with my friends was horrible"),
    ("The repair was done perfectly", "The repair was done poorly"),
    ("Her painting is beautiful and full of life", "Her painting is ugly and lifeless"),
    ("Until the very end the game was exciting", "Until the very end the game was boring"),
    ("Dinner was a great success", "Dinner was a total failure"),
    ("The neighbours are warm and welcoming", "The neighbours are hostile and unfriendly"),
    ("About the coming year I feel hopeful", "About the coming year I feel hopeless"),
]

_NEUTRAL_SENTENCES = [
    "the train leaves the station at nine in the morning.",
    "we planted tomatoes and beans along the fence.",
    "the library opens again after the holiday.",
    "my brother fixed the bicycle in the garage.",
    "the river runs past the old mill and the bridge.",
    "she wrote the report on her laptop last night.",
    "the bakery on the corner sells fresh bread.",
    "they painted the kitchen a pale shade of blue.",
    "the meeting was moved to thursday afternoon.",
    "a cat sat on the wall watching the birds.",
    "the museum has a room full of old maps.",
    "he carried the boxes up to the third floor.",
    "the children built a castle out of sand.",
    "the bus was full so we walked home.",
    "our team finished the project before the deadline.",
    "the lamp on the desk needs a new bulb.",
    "we read the letter twice before answering it.",
    "the farmer counted the sheep in the field.",
    "snow covered the road near the mountain pass.",
    "the kettle boiled while she set the table.",
]

_PROMPTS = [
    "I watched the movie last night and it was",
    "The hotel room turned out to be",
    "Honestly, the food at that place is",
    "My first day at the new job was",
    "The weather this weekend has been",
    "After reading the whole book, I think it is",
    "The service at the garage was",
    "Our holiday by the lake was",
    "The new phone I bought is",
    "Yesterday's concert in the park was",
    "The neighbourhood where we live is",
    "The presentation this morning was",
]


@dataclass(frozen=True)
class Behaviour:
    """A contrastive behaviour set (see the module docstring for the meaning of each field)."""

    name: str
    description: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    prompts: tuple[str, ...]
    positive_markers: tuple[str, ...] = ()
    negative_markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("positive", "negative", "prompts", "positive_markers", "negative_markers"):
            value = getattr(self, key)
            if isinstance(value, str) or not all(isinstance(t, str) and t for t in value):
                raise ValueError(f"behaviour {self.name!r}: {key} must be a list of non-empty strings")
            object.__setattr__(self, key, tuple(value))
        for key in ("positive", "negative", "prompts"):
            if not getattr(self, key):
                raise ValueError(f"behaviour {self.name!r}: {key} is empty")
        if bool(self.positive_markers) != bool(self.negative_markers):
            raise ValueError(f"behaviour {self.name!r}: give both positive_markers and negative_markers, or neither")
        if len(self.positive) < 2 or len(self.negative) < 2:
            raise ValueError(f"behaviour {self.name!r}: needs at least 2 positive and 2 negative texts (one of each "
                             "is held out for the probe)")

    @property
    def has_markers(self) -> bool:
        """Whether the marker judge (behaviour rate) applies."""
        return bool(self.positive_markers)

    def split(self, part: str) -> tuple[list[str], list[str]]:
        """``(positive, negative)`` of ``part``: ``"test"`` is every 4th text (indices 3, 7, ...; at least one
        of each side), ``"train"`` the rest, ``"all"`` everything."""
        if part not in ("train", "test", "all"):
            raise ValueError(f"part must be 'train', 'test' or 'all', got {part!r}")
        out = []
        for texts in (self.positive, self.negative):
            test = [i for i in range(len(texts)) if i % 4 == 3] or [len(texts) - 1]
            keep = range(len(texts)) if part == "all" else (test if part == "test" else
                                                             [i for i in range(len(texts)) if i not in test])
            out.append([texts[i] for i in keep])
        return out[0], out[1]


BEHAVIOURS: dict[str, Behaviour] = {
    "sentiment": Behaviour(
        name="sentiment",
        description="positive vs negative evaluations (minimal pairs); markers: positive vs negative adjectives",
        positive=tuple(p for p, _ in _SENTIMENT_PAIRS), negative=tuple(n for _, n in _SENTIMENT_PAIRS),
        prompts=tuple(_PROMPTS),
        positive_markers=(" wonderful", " great", " excellent", " lovely", " amazing"),
        negative_markers=(" terrible", " awful", " horrible", " bad", " disappointing")),
    "uppercase": Behaviour(
        name="uppercase",
        description="the same sentences in capitals vs as written; markers: capitalised vs lower-case words",
        positive=tuple(s.rstrip(".").upper() for s in _NEUTRAL_SENTENCES),
        negative=tuple(s[0].upper() + s[1:].rstrip(".") for s in _NEUTRAL_SENTENCES),
        prompts=tuple(_PROMPTS),
        positive_markers=(" THE", " A", " VERY", " REALLY", " NOT"),
        negative_markers=(" the", " a", " very", " really", " not")),
}


def behaviour_names() -> list[str]:
    """Names of the built-in behaviours."""
    return sorted(BEHAVIOURS)


def get_behaviour(name: str) -> Behaviour:
    """The built-in behaviour ``name`` (``ValueError`` naming the known ones otherwise)."""
    if name not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {name!r}; built-in behaviours: {', '.join(behaviour_names())}")
    return BEHAVIOURS[name]


def load_behaviour(path: str | Path) -> Behaviour:
    """A user's behaviour from a JSON file (plain ``json``; nothing in it is executed)::

        {"name": "formality", "positive": ["...", ...], "negative": ["...", ...],
         "prompts": ["...", ...], "positive_markers": [" Sir"], "negative_markers": [" mate"]}

    ``positive`` and ``negative`` are required (at least 2 each); ``prompts`` defaults to the held-out negative
    texts (``Behaviour.split("test")``); markers are optional (without them there is no behaviour rate, only the
    probe score).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"behaviour file {str(path)!r} does not exist (expected a JSON object with 'positive' and "
                         "'negative' lists of texts)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"behaviour file {str(path)!r} is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"behaviour file {str(path)!r} must hold a JSON object, got {type(raw).__name__}")
    known = {"name", "description", "positive", "negative", "prompts", "positive_markers", "negative_markers"}
    extra = sorted(set(raw) - known)
    if extra:
        raise ValueError(f"behaviour file {str(path)!r} has unknown keys {extra}; known: {sorted(known)}")
    missing = [k for k in ("positive", "negative") if k not in raw]
    if missing:
        raise ValueError(f"behaviour file {str(path)!r} lacks {missing}")
    for key in known - {"name", "description"}:
        if key in raw and not isinstance(raw[key], list):
            raise ValueError(f"behaviour file {str(path)!r}: {key!r} must be a list of strings")
    name = str(raw.get("name", path.stem))
    prompts = raw.get("prompts")
    if prompts is None:
        prompts = Behaviour(name, "", raw["positive"], raw["negative"], ["x"]).split("test")[1]
    return Behaviour(name=name, description=str(raw.get("description", f"from {path.name}")),
                     positive=raw["positive"], negative=raw["negative"], prompts=prompts,
                     positive_markers=raw.get("positive_markers", []), negative_markers=raw.get("negative_markers", []))


__all__ = ["Behaviour", "BEHAVIOURS", "behaviour_names", "get_behaviour", "load_behaviour"]
