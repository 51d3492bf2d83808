"""The texts scripts/bench/serve sends, and what it needs to know about them.

``texts N SEED FILE``: N texts, one a line, drawn from a fixed generator: lengths
log-uniform from 3 to 250 words (a search query to a retrieval chunk: about 5 to
300 tokens for the BERT tokenizers, some past MiniLM's 256), words from a fixed
list of common English words with Zipf frequencies, sentences cut every 8 to 20
words. The same N and SEED give the same file on every machine (NumPy's PCG64).

``bodies FILE MODEL OUT``: one OpenAI embeddings request body a line (one text each,
``encoding_format`` float), for oha's ``-Z``.

``tokens FILE MODEL_DIR``: the mean and total tokens per text as the model runs them
(special tokens included, truncated to its ``max_seq_length``), with the model's own
tokenizer.json, printed as ``MEAN TOTAL MIN MAX``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

WORDS = """the of and to a in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there one all we their been has when
who will more no if out so said what up its about into than them can only other new
some could time these two may then do first any my now such like our over man me even
most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came right
used take three states himself few house use during without again place american around
however home small found thought went say part once general high upon school every
don does got united left number course war until always away something fact though water
less public put think almost hand enough far took head yet government system better set
told nothing night end why called didn find look asked later knew point next program
city business give group toward young days let room president side social given present
several order national possible rather second face per among form important often things
looked early white case john become large big need four within felt along children saw
best church ever least power development light thing seemed family interest want members
mind country area others done turned although open god service problem certain kind
different thus began door help sense means whole matter perhaps itself york times law
human line above name example action company hands local show whether five history gave
today either act feet across taken past quite anything seen having death week experience
attention encoder vector search query document answer question model embedding retrieval
""".split()

MIN_WORDS, MAX_WORDS = 3, 250


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(MIN_WORDS), np.log(MAX_WORDS + 1), size=n)).astype(int)
    weights = 1.0 / np.arange(1, len(WORDS) + 1)
    weights /= weights.sum()
    out = []
    for k in lengths:
        words = list(rng.choice(WORDS, size=int(k), p=weights))
        sentences, start = [], 0
        while start < len(words):
            stop = start + int(rng.integers(8, 21))
            chunk = words[start:stop]
            sentences.append(" ".join([chunk[0].capitalize(), *chunk[1:]]) + ".")
            start = stop
        out.append(" ".join(sentences))
    return out


def token_counts(lines: list[str], model_dir: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = model_dir / "sentence_bert_config.json"
    max_len = json.loads(config.read_text())["max_seq_length"] if config.is_file() else 512
    tok.no_padding()
    tok.enable_truncation(max_len)
    return [len(e.ids) for e in tok.encode_batch(lines)]


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "texts":
        n, seed, path = int(args[0]), int(args[1]), Path(args[2])
        path.write_text("".join(t + "\n" for t in texts(n, seed)))
    elif command == "bodies":
        lines = Path(args[0]).read_text().splitlines()
        body = {"model": args[1], "encoding_format": "float"}
        Path(args[2]).write_text("".join(json.dumps({**body, "input": [t]}) + "\n" for t in lines))
    elif command == "tokens":
        counts = token_counts(Path(args[0]).read_text().splitlines(), Path(args[1]))
        print(f"{np.mean(counts):.2f} {sum(counts)} {min(counts)} {max(counts)}")
    else:
        sys.exit(f"serve_texts.py: unknown command {command!r} (texts, bodies, tokens)")


if __name__ == "__main__":
    main(sys.argv[1:])
