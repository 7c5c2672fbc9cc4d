#!/usr/bin/python3
"""sampling_ref.py CASES.jsonl - the sampler against Hugging Face's logits processors.

Each line of CASES.jsonl (written by build/tests/test_sample, case
dump_cases) holds fixed logits, random sampling parameters, a prompt and
the generated tokens so far, and the kept set and probabilities kvkeep's
sampler computed (ke_sampler_dist). This script recomputes them in NumPy
(float64) the way transformers' generate() does, processor by processor,
in the order of generation/utils.py _get_logits_processor:

  RepetitionPenaltyLogitsProcessor   prompt + generated ids, once per id:
                                     score < 0 ? score * r : score / r
  (presence / frequency penalty)     not in HF: the OpenAI / vLLM rule
                                     logit -= freq * count + pres * (count > 0),
                                     generated tokens only, right after the
                                     repetition penalty as vLLM applies it
  greedy when temperature == 0       argmax (the first maximal id)
  TemperatureLogitsWarper            scores / T
  TopKLogitsWarper                   scores < k-th largest -> -inf (ties kept)
  TopPLogitsWarper                   ascending sort, cumsum of softmax,
                                     cum <= 1 - top_p -> -inf, the top kept
  MinPLogitsWarper                   probs < min_p * max prob -> -inf
  softmax                            the distribution the draw uses

and compares: kept sets exactly, probabilities within 1e-9 (relative to
each, plus 1e-12 absolute). Prints "ok ref_sampling:NAME" or
"FAIL ref_sampling:NAME: why" lines.
"""
import json
import sys

import numpy as np


def softmax(x):
    m = np.max(x)
    e = np.where(np.isfinite(x), np.exp(x - m), 0.0)
    return e / e.sum()


def hf_dist(c):
    # the logits are float32 in C: read them as float32, compute in float64
    x = np.array(c["logits"], dtype=np.float32).astype(np.float64)
    prompt, gen = c["prompt"], c["gen"]
    r = c["repetition_penalty"]
    if r != 1.0:
        for i in set(prompt) | set(gen):
            s = x[i]
            x[i] = s * r if s < 0 else s / r
    counts = np.bincount(np.array(gen, dtype=np.int64), minlength=len(x)).astype(np.float64) if gen else np.zeros(len(x))
    fin = np.isfinite(x)
    x = np.where(fin, x - c["frequency_penalty"] * counts - c["presence_penalty"] * (counts > 0), x)
    if c["temperature"] == 0.0:
        return [int(np.argmax(x))], [1.0]
    x = x / c["temperature"]
    k = c["top_k"]
    if k > 0:
        k = min(k, len(x))
        kth = np.sort(x)[-k]
        x = np.where(x < kth, -np.inf, x)
    if c["top_p"] < 1.0:
        order = np.argsort(x, kind="stable")
        p = softmax(x[order])
        cum = np.cumsum(p)
        remove = cum <= 1.0 - c["top_p"]
        remove[-1] = False
        x[order[remove]] = -np.inf
    if c["min_p"] > 0.0:
        p = softmax(x)
        remove = p < c["min_p"] * p.max()
        keep_top = np.argmax(p)
        remove[keep_top] = False
        x = np.where(remove, -np.inf, x)
    p = softmax(x)
    ids = [int(i) for i in np.nonzero(p > 0)[0]]
    return ids, [float(p[i]) for i in ids]


def main():
    path = sys.argv[1]
    n = bad = 0
    kinds = {"greedy": 0, "top_k": 0, "top_p": 0, "min_p": 0, "penalties": 0}
    with open(path) as f:
        for line in f:
            c = json.loads(line)
            n += 1
            want_ids, want_p = hf_dist(c)
            got = dict(zip(c["ids"], c["probs"]))
            want = dict(zip(want_ids, want_p))
            name = "case_%d" % c["case"]
            if set(got) != set(want):
                bad += 1
                only_c = sorted(set(got) - set(want))[:8]
                only_r = sorted(set(want) - set(got))[:8]
                print("FAIL ref_sampling:%s: kept sets differ (%d vs %d tokens; only kvkeep: %s, only reference: %s)"
                      % (name, len(got), len(want), only_c, only_r))
                continue
            worst = max(abs(got[i] - want[i]) / (want[i] + 1e-12) for i in want)
            if worst > 1e-9:
                bad += 1
                print("FAIL ref_sampling:%s: probabilities differ by %.3g (relative)" % (name, worst))
                continue
            if c["temperature"] == 0.0:
                kinds["greedy"] += 1
            if c["top_k"] > 0:
                kinds["top_k"] += 1
            if c["top_p"] < 1.0:
                kinds["top_p"] += 1
            if c["min_p"] > 0.0:
                kinds["min_p"] += 1
            if c["repetition_penalty"] != 1.0 or c["presence_penalty"] or c["frequency_penalty"]:
                kinds["penalties"] += 1
    if n == 0:
        print("FAIL ref_sampling:cases: no cases in %s" % path)
        return 1
    for k, v in kinds.items():
        # every processor must have been exercised, else the comparison proves little
        if v == 0:
            print("FAIL ref_sampling:coverage_%s: no passing case used it" % k)
            bad += 1
        else:
            print("ok ref_sampling:coverage_%s (%d cases)" % (k, v))
    if bad == 0:
        print("ok ref_sampling:all_%d_cases" % n)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
