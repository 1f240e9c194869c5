"""The "words" synthetic set: everyday multi-step word problems with reference Python solutions
(`generate.make_words`); templates live in `money`, `budget`, `everyday`, `places`, `home` and `groups`."""
