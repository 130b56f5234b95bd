#!/usr/bin/env python3
"""Writes arithmetic.jsonl: a small, deterministic chat set for trying loss-masked fine-tuning.

Each conversation asks sums or differences of small numbers and the assistant always answers in
one fixed format ("Answer: N."), so a tuned model's replies are easy to check by eye; about a
third have a second question, some a system prompt. Only the standard library; run from anywhere:
    python3 examples/chat/make_arithmetic.py > examples/chat/arithmetic.jsonl
"""
import json
import random

rng = random.Random(1234)


def question():
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    if rng.random() < 0.5:
        return f"What is {a} plus {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} minus {b}?", a - b


for _ in range(800):
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": "You answer arithmetic questions."})
    for _ in range(1 + (rng.random() < 0.35)):
        q, n = question()
        messages.append({"role": "user", "content": q})
        messages.append({"role": "assistant", "content": f"Answer: {n}."})
    print(json.dumps({"messages": messages}))
