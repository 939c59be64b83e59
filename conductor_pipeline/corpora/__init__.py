"""Corpora: the public data files (registered by URL and sha256) and the questions loaded from them.

`sources` finds a registered file (mirror, cache, or a hashed download) and refuses bytes that are
not the registered ones; `loaders` parses MATH500, the full MATH set and GSM8K into `Question`s;
`summaries` renders what they hold as the markdown tables the assets publish.
Feeds the `math500_corpus`, `math_corpus`, `gsm8k_corpus` and `questions` assets.
"""
