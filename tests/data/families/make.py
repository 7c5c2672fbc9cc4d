#!/usr/bin/python3
"""tests/data/families/make.py BUILTIN_TOKENIZER_DIR - writes granite4/ and
nemotron2/ beside this script: tokenizer.json and tokenizer_config.json
files of the same type as the Granite 4.0-H and Nemotron Nano 2 releases
(byte-level BPE, a Split pre-tokenizer with the family's regex, the family's
added tokens; the chat template of each family's format, written for
kvkeep: granite4.jinja / nemotron2.jinja). No npm package ships those
tokenizers, and nothing can be downloaded here, so the tests run on these:
the vocabulary and merges are kvkeep's built-in tokenizer's (`kvkeep
mkmodel` writes it), ids 657 on are the family's added tokens.

Run again after changing a template:
  kvkeep mkmodel --preset tiny-dense --config-only --out /tmp/t --no-sync
  /usr/bin/python3 tests/data/families/make.py /tmp/t
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# cl100k-style split (what Granite's GPT-2 BPE tokenizers use)
GRANITE_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# the tekken-style split of Nemotron Nano 2's tokenizer
NEMOTRON_RE = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
               "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?"
               "[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

FAMILIES = {
    "granite4": {
        "regex": GRANITE_RE,
        "added": [("<|end_of_text|>", True), ("<|start_of_role|>", True), ("<|end_of_role|>", True),
                  ("<|pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
                  ("<tool_response>", False), ("</tool_response>", False)],
        "bos": "<|end_of_text|>", "eos": "<|end_of_text|>", "pad": "<|pad|>",
        "template": "granite4.jinja",
    },
    "nemotron2": {
        "regex": NEMOTRON_RE,
        "added": [("<s>", True), ("<SPECIAL_10>", True), ("<SPECIAL_11>", True), ("<SPECIAL_12>", True),
                  ("<think>", False), ("</think>", False), ("<TOOLCALL>", False), ("</TOOLCALL>", False),
                  ("<AVAILABLE_TOOLS>", False), ("</AVAILABLE_TOOLS>", False),
                  ("<TOOL_RESPONSE>", False), ("</TOOL_RESPONSE>", False)],
        "bos": "<s>", "eos": "<SPECIAL_12>", "pad": "<SPECIAL_12>",
        "template": "nemotron2.jinja",
    },
}


def main():
    src = sys.argv[1]
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    first = min(a["id"] for a in base["added_tokens"])
    for name, fam in FAMILIES.items():
        tok = json.loads(json.dumps(base))
        tok["added_tokens"] = []
        dec = {}
        for i, (content, special) in enumerate(fam["added"]):
            e = {"id": first + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": special}
            tok["added_tokens"].append(e)
            dec[str(first + i)] = {k: e[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word",
                                                     "special")}
        tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = fam["regex"]
        with open(os.path.join(HERE, fam["template"]), encoding="utf-8") as f:
            tmpl = f.read()
        cfg = {
            "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": dec,
            "bos_token": fam["bos"], "chat_template": tmpl, "clean_up_tokenization_spaces": False,
            "eos_token": fam["eos"], "errors": "replace", "model_max_length": 131072, "pad_token": fam["pad"],
            "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None,
        }
        out = os.path.join(HERE, name)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=2)
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=2)


if __name__ == "__main__":
    main()
