"""Train the shipped tokenizer once: byte-level BPE over ShareGPT text, 4,096 tokens.

    python scripts/train_tokenizer.py            # writes radixcache/traffic/tokenizer/

Byte-level BPE (GPT-2's scheme, Hugging Face ``tokenizers``) encodes any UTF-8 text and
decodes it back byte for byte, whatever the script, emoji or code; the vocabulary is fixed
here, so a server that encodes untrusted text never grows. The four chat-template markers are
special tokens 0-3. The corpus is the first ``--records`` complete records of the packaged
ShareGPT file (``traffic.sharegpt_text``), read the way the trace reads it. The output is
checked in; rerunning with the same arguments and library version gives the same file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from radixcache.traffic.sharegpt_text import dataset_file, decode_records, record_messages
from radixcache.traffic.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, TOKENIZER_DIR

VOCAB = 4096


def texts(records: int) -> Iterator[str]:
    """Every message of the first ``records`` records, in file order."""
    with dataset_file() as found:
        decoded, _ = decode_records(found.read_bytes())
    for record in decoded[:records]:
        for _role, text in record_messages(record):
            yield text


def train(records: int, vocab: int) -> Tokenizer:
    """A byte-level BPE of ``vocab`` tokens trained on ``texts(records)``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(records), trainer)
    return tok


def main() -> None:
    """Train and write ``tokenizer.json`` and ``tokenizer_config.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    args = parser.parse_args()
    tok = train(args.records, args.vocab)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"), pretty=False)
    bos, _hdr, _end, eot = SPECIAL_TOKENS
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos,
              "eos_token": eot, "pad_token": eot, "unk_token": None,
              "add_bos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": 65536, "chat_template": CHAT_TEMPLATE}
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{tok.get_vocab_size()} tokens -> {args.out}")


if __name__ == "__main__":
    main()
