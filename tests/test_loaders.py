"""Dataset loaders (tfds on mock data and on tiny array_record files, LEAF on tiny JSON files)
and the `fedjax-rep data` command; offline and fast."""

import json
import logging
import os
import time
import types

import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.data import flat, leaf, partition, tfds_data
from fedjax_rep.data.federated import pad
from fedjax_rep.data.missing import DataMissing
from fedjax_rep.experiments import runner


@pytest.fixture(autouse=True)
def empty_homes(tmp_path, monkeypatch):
  """Every default data location points into an empty tmp directory."""
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  monkeypatch.setenv("FEDJAX_REP_LEAF_DIR", str(tmp_path / "leaf"))
  monkeypatch.delenv("FEDJAX_REP_GLOVE", raising=False)


# ---- tensorflow-datasets ----

@pytest.mark.parametrize("name, shape, classes", [
    ("cifar10", (32, 32, 3), 10), ("cifar100", (32, 32, 3), 100),
    ("emnist", (28, 28, 1), 62), ("emnist/letters", (28, 28, 1), 37)])
def test_tfds_mock_shapes_dtypes_and_ranges(name, shape, classes):
  x, y, x_test, y_test = tfds_data.load(name, mock_examples=40)
  assert x.shape == x_test.shape == (40, *shape)
  assert x.dtype == x_test.dtype == np.float32 and y.dtype == y_test.dtype == np.int32
  assert y.shape == y_test.shape == (40,)
  for images, labels in ((x, y), (x_test, y_test)):
    assert 0.0 <= images.min() and images.max() <= 1.0 and images.std() > 0
    assert 0 <= labels.min() and labels.max() < classes


def test_tfds_mock_data_log_no_missing_dataset_info_warning(caplog):
  # tfds's mock metadata folders hold no dataset_info.json, and tfds warns of it on the
  # 'absl' logger on every mock load; the mock data need none.
  absl = logging.getLogger("absl")
  filters = list(absl.filters)
  with caplog.at_level(logging.WARNING):
    tfds_data.load("cifar10", mock_examples=4)
    absl.warning("Variant folder x has invalid version y")  # other warnings still pass
  messages = [record.getMessage() for record in caplog.records]
  assert not [m for m in messages if "has no dataset_info.json" in m], messages
  assert "Variant folder x has invalid version y" in messages
  assert absl.filters == filters


def test_tfds_missing_is_fast_and_names_the_command(tmp_path):
  empty = str(tmp_path / "empty")
  start = time.perf_counter()
  with pytest.raises(DataMissing) as error:
    tfds_data.load("cifar10", empty)
  assert time.perf_counter() - start < 0.2
  message = str(error.value)
  assert isinstance(error.value, FileNotFoundError) and "\n" not in message
  assert message.startswith(f"CIFAR-10 is not in {empty}")
  assert f"tfds build cifar10 --file_format=array_record --data_dir={empty}" in message
  assert tfds_data.status("emnist", empty) == (False, empty)
  assert "tfds build emnist/balanced " in tfds_data.how_to("emnist")
  with pytest.raises(ValueError, match="emnist/CONFIG"):
    tfds_data.status("cifar10/x")


def test_tfds_data_dir_defaults_to_env(tmp_path):
  assert tfds_data.root() == str(tmp_path / "tfds")
  assert tfds_data.status("cifar100") == (False, str(tmp_path / "tfds"))


def write_cifar10(data_dir, sizes, file_format="array_record"):
  """A prepared cifar10 in data_dir as `tfds build` writes it (dataset_info.json and one shard
  per split), written without TensorFlow; returns {split: (images uint8, labels)}."""
  import tensorflow_datasets as tfds
  from array_record.python.array_record_module import ArrayRecordWriter
  from PIL import Image
  builder = tfds.builder("cifar10", data_dir=str(data_dir), file_format=file_format)
  path = builder.data_path
  os.makedirs(path)
  rng = np.random.default_rng(0)
  data, splits = {}, []
  for split, size in sizes.items():
    images = rng.integers(0, 256, (size, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size)
    name = os.path.join(path, f"cifar10-{split}.{file_format}-00000-of-00001")
    if file_format == "array_record":
      writer = ArrayRecordWriter(name, "group_size:1")
      for i, (image, label) in enumerate(zip(images, labels)):
        writer.write(builder.info.features.serialize_example(
            {"id": f"{split}_{i}", "image": Image.fromarray(image), "label": int(label)}))
      writer.close()
    data[split] = images, labels
    splits.append(tfds.core.SplitInfo(
        name=split, shard_lengths=[size], num_bytes=0,
        filename_template=tfds.core.ShardedFileTemplate(
            data_dir=path, template=tfds.core.naming.DEFAULT_FILENAME_TEMPLATE,
            dataset_name="cifar10", split=split, filetype_suffix=file_format)))
  builder.info.set_splits(tfds.core.SplitDict(splits))
  builder.info.write_to_directory(path)
  return data


def test_tfds_reads_prepared_array_record_files(tmp_path, monkeypatch):
  monkeypatch.setattr(tfds_data, "_BATCH", 4)  # several __getitems__ calls
  data = write_cifar10(tmp_path, {"train": 10, "test": 3})
  present, location = tfds_data.status("cifar10", str(tmp_path))
  assert present and location == str(tmp_path / "cifar10" / "3.0.2")
  x, y, x_test, y_test = tfds_data.load("cifar10", str(tmp_path))
  for (images, labels), xs, ys in ((data["train"], x, y), (data["test"], x_test, y_test)):
    assert xs.dtype == np.float32 and ys.dtype == np.int32
    np.testing.assert_array_equal(xs, images / np.float32(255))
    np.testing.assert_array_equal(ys, labels)


def test_tfds_tfrecord_build_counts_as_missing(tmp_path):
  write_cifar10(tmp_path, {"train": 3, "test": 2}, file_format="tfrecord")
  assert not tfds_data.status("cifar10", str(tmp_path))[0]
  with pytest.raises(DataMissing, match="--file_format=array_record"):
    tfds_data.load("cifar10", str(tmp_path))


def test_classes_partition_of_mock_cifar10_labels():
  _, y, _, y_test = tfds_data.load("cifar10", mock_examples=400)
  train, test = partition.partition("classes", y, y_test, num_clients=10, seed=0,
                                    classes_per_client=2)
  for parts in (train, test):
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat)
  assert all(1 <= len(np.unique(y[p])) <= 2 for p in train)
  assert all(set(y_test[q]) <= set(y[p]) for p, q in zip(train, test))


# ---- LEAF ----

def write_leaf(directory, split, files):
  """LEAF JSON files directory/split/part_i.json, file i holding the users {user: (x, y)}
  of files[i]."""
  os.makedirs(directory / split, exist_ok=True)
  for i, users in enumerate(files):
    blob = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    (directory / split / f"part_{i}.json").write_text(json.dumps(blob))


# FEMNIST writers: (train samples, test samples); w4 has too few train samples for
# min_samples=2 and w5 no test sample.
WRITERS = {"w0": (5, 2), "w1": (3, 1), "w2": (8, 3), "w3": (4, 1), "w4": (1, 1), "w5": (6, 0)}


@pytest.fixture
def femnist(tmp_path):
  """(directory, {writer: (train sample numbers, test sample numbers)}) of a FEMNIST at the
  default location; sample number k (1..27 train, 28..35 test) has every pixel k / 1000 and
  label k % 62."""
  directory = tmp_path / "leaf" / "femnist" / "data"
  numbers, counter = {u: ([], []) for u in WRITERS}, iter(range(1, 1000))
  for split, column in (("train", 0), ("test", 1)):
    users = {}
    for user, sizes in WRITERS.items():
      ks = [next(counter) for _ in range(sizes[column])]
      numbers[user][column].extend(ks)
      users[user] = ([[k / 1000] * 784 for k in ks], [k % 62 for k in ks])
    write_leaf(directory, split, [{u: users[u] for u in ("w0", "w1", "w2")},
                                  {u: users[u] for u in ("w3", "w4", "w5")}])
  return str(directory), numbers


def padded(data):
  """A flat store's clients (`flat.FlatClients`) as padded arrays x [n, m, ...], y [n, m],
  counts, x_test, y_test, test_counts (`pad`), as the assertions below read them."""
  assert isinstance(data, flat.FlatClients)
  x, y = np.asarray(data.x), np.asarray(data.y)
  rows = lambda offsets, counts: [np.arange(o, o + c) for o, c in zip(np.asarray(offsets),
                                                                      np.asarray(counts))]
  train, test = (pad(x, y, rows(o, c)) for o, c in (
      (data.offsets, data.counts), (data.test_offsets, data.test_counts)))
  return types.SimpleNamespace(x=train[0], y=train[1], counts=train[2], x_test=test[0],
                               y_test=test[1], test_counts=test[2],
                               num_classes=data.num_classes)


def numbers_of(x, counts):
  """[client] -> sorted sample numbers k of the client's real rows of x [n, m, 28, 28, 1]."""
  x = np.asarray(x)
  return [sorted(np.round(x[i, :c, 0, 0, 0] * 1000).astype(int).tolist())
          for i, c in enumerate(np.asarray(counts))]


def test_femnist_natural_users_are_clients_with_leafs_split(femnist):
  directory, numbers = femnist
  stored = leaf.femnist_natural(num_clients=3, seed=0, min_samples=2, directory=directory)
  assert stored.x.shape[0] == sum(stored.counts) + sum(stored.test_counts)  # the samples alone
  data = padded(stored)  # writers' sizes differ: a flat store
  counts, test_counts = np.asarray(data.counts), np.asarray(data.test_counts)
  assert data.x.shape == (3, counts.max(), 28, 28, 1) and data.x.dtype == np.float32
  assert data.x_test.shape == (3, test_counts.max(), 28, 28, 1)
  assert data.y.dtype == data.y_test.dtype == np.int32 and data.num_classes == 62
  train, test = numbers_of(data.x, counts), numbers_of(data.x_test, test_counts)
  users = [next(u for u in WRITERS if numbers[u][0] == ks) for ks in train]
  assert len(set(users)) == 3 and not {"w4", "w5"} & set(users)
  assert [numbers[u][1] for u in users] == test  # LEAF's own split
  for i, ks in enumerate(train):
    np.testing.assert_array_equal(np.sort(np.asarray(data.y[i, :counts[i]])),
                                  np.array(ks) % 62)
    assert not np.asarray(data.x[i, counts[i]:]).any()
  again = leaf.femnist_natural(num_clients=3, seed=0, min_samples=2)  # default location
  np.testing.assert_array_equal(again.x, stored.x)
  picks = {tuple(np.asarray(leaf.femnist_natural(3, seed=s, min_samples=2).counts))
           for s in range(10)}
  assert len(picks) > 1
  with pytest.raises(ValueError, match="only 4 users have at least min_samples=2"):
    leaf.femnist_natural(num_clients=5, min_samples=2)


def test_femnist_pooled_and_classes(femnist):
  x, y, x_test, y_test = leaf.femnist_pooled()
  assert x.shape == (27, 28, 28, 1) and x_test.shape == (8, 28, 28, 1)
  assert x.dtype == x_test.dtype == np.float32 and y.dtype == y_test.dtype == np.int32
  assert numbers_of(x[None], [27]) == [list(range(1, 28))]
  assert numbers_of(x_test[None], [8]) == [list(range(28, 36))]
  np.testing.assert_array_equal(y, np.round(x[:, 0, 0, 0] * 1000).astype(int) % 62)
  x, y, x_test, y_test = leaf.femnist_pooled(classes=[30, 3])
  assert numbers_of(x[None], [1]) == [[3]] and y.tolist() == [1]
  assert numbers_of(x_test[None], [1]) == [[30]] and y_test.tolist() == [0]
  with pytest.raises(ValueError, match="distinct labels in 0..61"):
    leaf.femnist_pooled(classes=[1, 1])


def test_leaf_missing_names_the_command(tmp_path):
  default = str(tmp_path / "leaf" / "femnist" / "data")
  assert leaf.status("femnist") == (False, default)
  start = time.perf_counter()
  with pytest.raises(DataMissing) as error:
    leaf.femnist_natural(num_clients=2)
  assert time.perf_counter() - start < 0.2
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"FEMNIST (LEAF) is not in {default}: run")
  assert "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample" in message
  with pytest.raises(DataMissing, match=r"sent140 && \./preprocess\.sh -s niid"):
    leaf.sent140_natural(num_clients=2, directory=str(tmp_path / "nowhere"))


TWEETS = {  # user: ([(train text, label)], [(test text, label)])
    "ann": ([("Good good good day!", 1), ("bad day", 0)], [("good night", 1)]),
    "bob": ([("It's a GOOD, good thing", 1)], [("zebra crossing", 0), ("good", 1)]),
    "cid": ([("one two three four five six seven", 0)], [("seven", 0)]),
    "dan": ([("never tested", 1)], []),
}


@pytest.fixture
def sent140(tmp_path):
  directory = tmp_path / "sent140"
  for split, column in (("train", 0), ("test", 1)):
    write_leaf(directory, split, [{
        user: ([["1", "Mon May 11 2009", "NO_QUERY", user, text]
                for text, _ in rows[column]], [label for _, label in rows[column]])
        for user, rows in TWEETS.items()}])
  return directory


def test_sent140_tokens_vocabulary_padding_truncation(sent140):
  assert leaf.tokens("It's a GOOD, day!") == ["it's", "a", "good", ",", "day", "!"]
  data, vocab_size, embeddings = leaf.sent140_natural(
      num_clients=3, seed=0, max_len=4, vocab_size=6, directory=str(sent140))
  data = padded(data)  # users' sizes differ: a flat store
  assert embeddings is None and vocab_size == 6 and data.num_classes == 2
  assert data.x.shape == (3, 2, 4) and data.x.dtype == data.x_test.dtype == np.int32
  assert data.x_test.shape == (3, 2, 4)
  assert int(data.x.max()) < vocab_size and int(data.x_test.max()) < vocab_size
  # the chosen users' (ann, bob, cid) training tweets: good 5 times, day twice, then words
  # seen once, in sorted order ("!", ",", "a", ...); 6 ids leave room for 4 words
  vocab = leaf.vocabulary([t for rows in list(TWEETS.values())[:3] for t, _ in rows[0]], 6)
  assert vocab == {"good": 2, "day": 3, "!": 4, ",": 5}
  encoded = leaf.encode(["good good day", "zebra good zebra good zebra"], vocab, 4)
  np.testing.assert_array_equal(encoded, [[2, 2, 3, 0], [1, 2, 1, 2]])


def test_sent140_clients_are_users_with_leafs_split(sent140):
  data, vocab_size, _ = leaf.sent140_natural(num_clients=3, seed=1, max_len=8,
                                             directory=str(sent140))
  data = padded(data)  # users' sizes differ: a flat store
  words = leaf.vocabulary([t for u in ("ann", "bob", "cid") for t, _ in TWEETS[u][0]], 10000)
  assert vocab_size == 2 + len(words)  # dan (no test tweet) is never chosen
  inverse = {i: w for w, i in words.items()}
  seen = []
  for i in range(3):
    first = [inverse.get(int(t), "?") for t in np.asarray(data.x[i, 0]) if t]
    user = next(u for u, rows in TWEETS.items() if leaf.tokens(rows[0][0][0])[:8] == first)
    seen.append(user)
    n, t = len(TWEETS[user][0]), len(TWEETS[user][1])
    assert (int(data.counts[i]), int(data.test_counts[i])) == (n, t)
    np.testing.assert_array_equal(data.y[i, :n], [label for _, label in TWEETS[user][0]])
    np.testing.assert_array_equal(data.y_test[i, :t], [label for _, label in TWEETS[user][1]])
    assert not np.asarray(data.x[i, n:]).any() and not np.asarray(data.x_test[i, t:]).any()
  assert sorted(seen) == ["ann", "bob", "cid"]
  bob = seen.index("bob")
  np.testing.assert_array_equal(data.x_test[bob, 0, :3], [1, 1, 0])  # "zebra crossing"


def test_sent140_glove_rows(sent140, tmp_path):
  glove = tmp_path / "glove.6B.3d.txt"
  glove.write_text("good 1.0 2.0 3.0\nzzz 9 9 9\nday -1 0.5 0\n")
  data, vocab_size, table = leaf.sent140_natural(num_clients=3, seed=0, vocab_size=6,
                                                 glove_path=str(glove), directory=str(sent140))
  assert table.shape == (vocab_size, 3) and table.dtype == np.float32
  np.testing.assert_array_equal(table[leaf.PAD], 0.0)
  np.testing.assert_array_equal(table[2], [1.0, 2.0, 3.0])  # good
  np.testing.assert_array_equal(table[3], [-1.0, 0.5, 0.0])  # day
  assert 0 < np.abs(table[[leaf.UNKNOWN, 4, 5]]).max() < 1
  plain, _, _ = leaf.sent140_natural(num_clients=3, seed=0, vocab_size=6,
                                     directory=str(sent140))
  np.testing.assert_array_equal(plain.x, data.x)
  with pytest.raises(DataMissing, match="GloVe is not at"):
    leaf.sent140_natural(num_clients=3, glove_path=str(tmp_path / "no.txt"),
                         directory=str(sent140))


def test_pad_keeps_the_dtype():
  x, y, _ = pad(np.arange(6, dtype=np.int32).reshape(3, 2), np.arange(3), [[0, 2], [1]])
  assert x.dtype == np.int32 and x.tolist() == [[[0, 1], [4, 5]], [[2, 3], [0, 0]]]
  assert y.dtype == np.int32 and y.tolist() == [[0, 2], [1, 0]]


# ---- the command ----

def test_data_command_lists_every_dataset(capsys, femnist):
  assert cli.main(["data"]) == 0
  lines = capsys.readouterr().out.splitlines()
  status = {line.split()[0]: line.split()[1] for line in lines}
  assert status == {"digits": "present", "cifar10": "missing", "cifar100": "missing",
                    "emnist": "missing", "femnist": "present", "sent140": "missing",
                    "synthetic": "present", "glove": "missing"}
  cifar = next(line for line in lines if line.startswith("cifar10 "))
  assert "tfds build cifar10 --file_format=array_record" in cifar
  assert "get it" not in next(line for line in lines if line.startswith("femnist"))


def test_run_defaults_unchanged_and_data_missing_is_an_error(capsys, monkeypatch, tmp_path):
  calls = []

  def fake_run(recipe, **kwargs):
    calls.append(recipe)
    if recipe == "needs-data":
      raise DataMissing("CIFAR-10 is not in /x: run  tfds build cifar10")
    return str(tmp_path)

  monkeypatch.setattr(runner, "run_to_dir", fake_run)
  assert cli.main(["run"]) == 0 and calls == [cli.DEFAULT_RECIPE]
  assert cli.main(["run", "needs-data"]) == 2
  assert "fedjax-rep: error: CIFAR-10 is not in /x: run  tfds build cifar10" in (
      capsys.readouterr().err)
