"""FEMNIST and Sent140 in LEAF's JSON format (https://github.com/TalwalkarLab/leaf).

A LEAF dataset directory holds train/*.json and test/*.json, each file
{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}, with
LEAF's own per-user train/test split (`-t sample`: the same users in both). The directory of
dataset D is the `directory` argument, else $FEDJAX_REP_LEAF_DIR/D/data, else
~/leaf_data/D/data. The natural partition makes each selected user a client with its LEAF
train samples for training and its LEAF test samples for testing.
"""

import collections
import glob
import json
import os
import re

import numpy as np

from fedjax_rep.data import federated
from fedjax_rep.data.missing import DataMissing

LEAF_URL = "https://github.com/TalwalkarLab/leaf"
DATASETS = {"femnist": "FEMNIST (LEAF)", "sent140": "Sent140 (LEAF)"}
# Flags of LEAF's data/<dataset>/preprocess.sh: non-iid sample of a fraction --sf of the data,
# users with at least -k samples, each user's samples split 90/10 into train/test.
PREPROCESS = {"femnist": "-s niid --sf 0.05 -k 0 -t sample",
              "sent140": "-s niid --sf 0.3 -k 50 -t sample"}
FEMNIST_CLASSES = 62  # 0-9 digits, 10-35 upper case, 36-61 lower case letters
FEMNIST_LETTERS = tuple(range(10, 20))  # upper-case A..J, the papers' ten letters
PAD, UNKNOWN = 0, 1  # Sent140 token ids; words get ids 2, 3, ... by decreasing frequency
GLOVE_FILE = "glove.6B.50d.txt"
GLOVE_URL = "https://nlp.stanford.edu/data/glove.6B.zip"


def root() -> str:
  """The LEAF data root: env FEDJAX_REP_LEAF_DIR, else ~/leaf_data."""
  return os.path.expanduser(os.environ.get("FEDJAX_REP_LEAF_DIR") or "~/leaf_data")


def data_dir(dataset: str, directory: str | None = None) -> str:
  """The directory holding dataset's train/ and test/: `directory`, else ROOT/dataset/data."""
  if dataset not in DATASETS:
    raise ValueError(f"LEAF dataset must be one of {sorted(DATASETS)}, got {dataset!r}")
  return os.path.expanduser(directory or os.path.join(root(), dataset, "data"))


def status(dataset: str, directory: str | None = None) -> tuple[bool, str]:
  """(present, location): whether train/ and test/ of the data directory hold JSON files."""
  path = data_dir(dataset, directory)
  present = all(glob.glob(os.path.join(glob.escape(path), split, "*.json"))
                for split in ("train", "test"))
  return present, path


def how_to(dataset: str, directory: str | None = None) -> str:
  """The one-line command that prepares dataset with LEAF's scripts into its data directory."""
  path, source = data_dir(dataset, directory), f"leaf/data/{dataset}/data"
  return (f"git clone {LEAF_URL} && (cd leaf/data/{dataset} && ./preprocess.sh "
          f"{PREPROCESS[dataset]}) && mkdir -p {path} && cp -r {source}/train {source}/test "
          f"{path}/  (needs internet; set FEDJAX_REP_LEAF_DIR to keep LEAF data elsewhere)")


def glove_file(path: str | None = None) -> str:
  """The GloVe text file for Sent140: `path`, else env FEDJAX_REP_GLOVE, else
  ROOT/glove/glove.6B.50d.txt."""
  return os.path.expanduser(path or os.environ.get("FEDJAX_REP_GLOVE")
                            or os.path.join(root(), "glove", GLOVE_FILE))


def glove_status(path: str | None = None) -> tuple[bool, str]:
  """(present, location) of glove_file(path)."""
  path = glove_file(path)
  return os.path.isfile(path), path


def glove_how_to(path: str | None = None) -> str:
  """The one-line command that puts GloVe's 6B vectors next to glove_file(path)."""
  folder = os.path.dirname(glove_file(path))
  return (f"mkdir -p {folder} && wget -P {folder} {GLOVE_URL} && unzip {folder}/glove.6B.zip "
          f"-d {folder}  (needs internet; set FEDJAX_REP_GLOVE to use another file)")


def require(dataset: str, directory: str | None) -> str:
  """The data directory of dataset, or DataMissing naming the command that prepares it."""
  present, path = status(dataset, directory)
  if not present:
    raise DataMissing(f"{DATASETS[dataset]} is not in {path}: run  {how_to(dataset, directory)}")
  return path


def _read(path: str, split: str, convert) -> dict:
  """{user: convert(x, y)} over the LEAF JSON files path/split/*.json."""
  data = {}
  for name in sorted(glob.glob(os.path.join(glob.escape(path), split, "*.json"))):
    with open(name) as f:
      blob = json.load(f)
    try:
      for user in blob["users"]:
        data[user] = convert(blob["user_data"][user]["x"], blob["user_data"][user]["y"])
    except (KeyError, TypeError) as error:
      raise ValueError(f"{name} is not in LEAF's format ('users', 'user_data': {{user: {{'x', "
                       f"'y'}}}}): {error!r}") from None
  return data


def _femnist(x, y):
  """(images [n, 28, 28, 1] float32 as LEAF stores them (1.0 = white), labels [n] int32)."""
  return np.asarray(x, np.float32).reshape(-1, 28, 28, 1), np.asarray(y, np.int32)


def _sent140(x, y):
  """(tweet texts [n] (field 4 of LEAF's [id, date, query, user, text] rows), labels [n])."""
  return [row[4] for row in x], np.asarray(y, np.int32)


def select_users(train_sizes: dict, test_sizes: dict, num_clients: int, seed: int,
                 min_samples: int = 1) -> list:
  """num_clients distinct users, in the order of a seeded uniform draw from the sorted users
  with at least min_samples training samples (train_sizes: {user: count}) and at least one
  test sample (test_sizes)."""
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be an integer >= 1, got {num_clients}")
  eligible = sorted(user for user, size in train_sizes.items()
                    if size >= min_samples and test_sizes.get(user, 0) >= 1)
  if num_clients > len(eligible):
    raise ValueError(f"num_clients={num_clients} but only {len(eligible)} users have at least "
                     f"min_samples={min_samples} train samples and a test sample")
  chosen = np.random.default_rng(seed).choice(len(eligible), num_clients, replace=False)
  return [eligible[i] for i in chosen]


def _natural(train: dict, test: dict, users: list, num_classes: int):
  """The clients (`federated.natural`: a flat store where their sizes differ) whose client i
  holds users[i]'s (x, y) of train and of test."""
  def joined(data):
    x = np.concatenate([data[u][0] for u in users])
    y = np.concatenate([data[u][1] for u in users])
    parts = np.split(np.arange(len(y)), np.cumsum([len(data[u][1]) for u in users])[:-1])
    return x, y, parts

  x, y, parts = joined(train)
  x_test, y_test, test_parts = joined(test)
  return federated.natural(x, y, parts, x_test, y_test, test_parts, num_classes)


def _sizes(data: dict) -> dict:
  """{user: number of samples} of {user: (x, y)}."""
  return {user: len(y) for user, (_, y) in data.items()}


def femnist_natural(num_clients: int, seed: int = 0, min_samples: int = 1,
                    directory: str | None = None):
  """FEMNIST with its writers as clients, each with its own number of samples: num_clients
  writers (see select_users) as `federated.natural` holds them (a flat store where their
  sizes differ: `flat.FlatClients`), inputs [28, 28, 1] float32, labels int32 in 0..61,
  num_classes 62."""
  path = require("femnist", directory)
  train, test = _read(path, "train", _femnist), _read(path, "test", _femnist)
  users = select_users(_sizes(train), _sizes(test), num_clients, seed, min_samples)
  return _natural(train, test, users, FEMNIST_CLASSES)


def _relabelling(classes) -> np.ndarray:
  """[62] int32: classes[j] -> j, every other label -> -1 (classes checked)."""
  classes = np.asarray(classes)
  if (classes.ndim != 1 or not np.issubdtype(classes.dtype, np.integer) or len(classes) == 0
      or len(np.unique(classes)) != len(classes) or classes.min() < 0
      or classes.max() >= FEMNIST_CLASSES):
    raise ValueError(f"classes must be distinct labels in 0..{FEMNIST_CLASSES - 1}, got "
                     f"{classes.tolist()}")
  relabel = np.full(FEMNIST_CLASSES, -1, np.int32)
  relabel[classes] = np.arange(len(classes))
  return relabel


def femnist_pooled(classes=None, directory: str | None = None):
  """(x_train [N, 28, 28, 1], y_train [N], x_test [T, 28, 28, 1], y_test [T]): every writer's
  LEAF train (and test) samples pooled in sorted writer order, for a partition.py partition.
  With classes (distinct label values in 0..61), only their samples, relabelled
  classes[j] -> j."""
  relabel = None if classes is None else _relabelling(classes)
  path = require("femnist", directory)
  arrays = []
  for split in ("train", "test"):
    data = _read(path, split, _femnist)
    x = np.concatenate([data[u][0] for u in sorted(data)])
    y = np.concatenate([data[u][1] for u in sorted(data)])
    if relabel is not None:
      keep = relabel[y] >= 0
      x, y = x[keep], relabel[y[keep]]
    arrays += [x, y]
  return tuple(arrays)


def tokens(text: str) -> list[str]:
  """LEAF's Sent140 tokens of a tweet, lower-cased (GloVe's words are): words (with
  apostrophes) and the punctuation marks . , ! ? ;"""
  return re.findall(r"[\w']+|[.,!?;]", text.lower())


def vocabulary(texts, vocab_size: int) -> dict:
  """{word: id}: the vocab_size - 2 most frequent tokens of texts (ties by word) get ids 2, 3,
  ... in decreasing frequency; ids 0 (PAD) and 1 (UNKNOWN) are reserved."""
  counts = collections.Counter(t for text in texts for t in tokens(text))
  ranked = sorted(counts, key=lambda word: (-counts[word], word))[:vocab_size - 2]
  return {word: i + 2 for i, word in enumerate(ranked)}


def encode(texts, vocab: dict, max_len: int) -> np.ndarray:
  """Token ids [len(texts), max_len] int32: each text's first max_len tokens (UNKNOWN for words
  not in vocab), right-padded with PAD."""
  ids = np.full((len(texts), max_len), PAD, np.int32)
  for row, text in zip(ids, texts):
    words = tokens(text)[:max_len]
    row[:len(words)] = [vocab.get(word, UNKNOWN) for word in words]
  return ids


def glove_embeddings(path: str, vocab: dict, seed: int = 0) -> np.ndarray:
  """Embeddings [2 + len(vocab), dim] float32 for the ids of vocab, from the GloVe text file
  glove_file(path) (glove.6B.*d.txt): a word's GloVe vector where GloVe has the word,
  N(0, 0.1^2) entries (seeded) for the other words and UNKNOWN, zeros for PAD."""
  present, path = glove_status(path)
  if not present:
    raise DataMissing(f"GloVe is not at {path}: run  {glove_how_to(path)}")
  found = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      word, _, values = line.rstrip().partition(" ")
      if word in vocab:
        found[vocab[word]] = np.array(values.split(), np.float32)
  if not found:
    raise ValueError(f"{path} has none of the {len(vocab)} vocabulary words; is it a GloVe "
                     f"text file?")
  dim = len(next(iter(found.values())))
  table = (0.1 * np.random.default_rng(seed).normal(size=(2 + len(vocab), dim))).astype(
      np.float32)
  table[PAD] = 0.0
  for i, vector in found.items():
    table[i] = vector
  return table


def sent140_natural(num_clients: int, seed: int = 0, max_len: int = 25,
                    vocab_size: int = 10000, min_samples: int = 1,
                    glove_path: str | None = None, directory: str | None = None):
  """(clients, vocab_size, embeddings) of Sent140 with its Twitter users as clients.

  num_clients users (see select_users), each with its own number of tweets, as
  `federated.natural` holds them (a flat store where their sizes differ); the inputs
  [max_len] are int32 token ids (see encode) over the vocabulary of the
  chosen users' training tweets (see vocabulary), the same with or without GloVe; y, y_test
  int32 0 (negative) / 1 (positive), num_classes 2. The returned vocab_size (<= the
  argument) counts every id, PAD and UNKNOWN included. embeddings [vocab_size, dim] float32
  from the GloVe file glove_path (see glove_embeddings; e.g. glove_file()), else None.
  """
  if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
    raise ValueError(f"vocab_size must be an integer >= 2 (padding and unknown ids), got "
                     f"{vocab_size}")
  if not isinstance(max_len, (int, np.integer)) or max_len < 1:
    raise ValueError(f"max_len must be an integer >= 1, got {max_len}")
  path = require("sent140", directory)
  train, test = _read(path, "train", _sent140), _read(path, "test", _sent140)
  users = select_users(_sizes(train), _sizes(test), num_clients, seed, min_samples)
  vocab = vocabulary((text for u in users for text in train[u][0]), vocab_size)
  train, test = ({u: (encode(data[u][0], vocab, max_len), data[u][1]) for u in users}
                 for data in (train, test))
  embeddings = None if glove_path is None else glove_embeddings(glove_path, vocab, seed)
  return _natural(train, test, users, num_classes=2), 2 + len(vocab), embeddings


_WORDS = ("good", "bad", "happy", "sad", "love", "hate", "day", "night", "work", "fun",
          "great", "awful", "today", "tomorrow", "so", "not", "very", "!", "?", ".")


def write_example(dataset: str, directory: str, num_users: int, samples: int,
                  seed: int = 0) -> str:
  """A small random dataset in LEAF's JSON layout under directory/{train,test}/data.json
  (for --quick runs and tests; no real data): num_users users with `samples` training and
  samples // 4 + 1 test samples each. FEMNIST: random 28x28 images of 62 classes whose mean
  brightness depends on the label; Sent140: tweets of random words whose label is whether
  'good'-like words outnumber 'bad'-like ones. Returns `directory`."""
  if dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {dataset!r}")
  rng = np.random.default_rng(seed)

  def user_data(count):
    if dataset == "femnist":
      y = rng.integers(0, FEMNIST_CLASSES, count)
      x = np.clip(rng.normal(y[:, None] / FEMNIST_CLASSES, 0.3, (count, 784)), 0, 1)
      return {"x": np.round(x, 3).tolist(), "y": y.tolist()}
    words = rng.choice(_WORDS, (count, 8))
    y = [int((w == "good").sum() + (w == "happy").sum() >= (w == "bad").sum()
             + (w == "sad").sum()) for w in words]
    rows = [[str(i), "date", "NO_QUERY", "user", " ".join(w)] for i, w in enumerate(words)]
    return {"x": rows, "y": y}

  users = [f"u{i:04d}" for i in range(num_users)]
  for split, count in (("train", samples), ("test", samples // 4 + 1)):
    blob = {"users": users, "num_samples": [count] * num_users,
            "user_data": {u: user_data(count) for u in users}}
    os.makedirs(os.path.join(directory, split), exist_ok=True)
    with open(os.path.join(directory, split, "data.json"), "w") as f:
      f.write(json.dumps(blob))  # json.dumps encodes in C, json.dump in Python
  return directory
