"""Regenerates ``tiny_tales.txt``, the character-level corpus shipped for ``torch_tpu.demo``.

The corpus is original text: short children's tales assembled from the hand-written grammar
below with a fixed seed, so it is reproducible, free of any licence question, and regular enough
that a tiny model visibly learns words and sentence shapes within a few hundred steps.

Run from this folder::

    python generate_tales.py          # rewrites tiny_tales.txt (byte-identical for the same seed)
"""

from __future__ import annotations

import pathlib
import random

SEED = 1234
TARGET_BYTES = 100_000

HEROES = [
    ("fox", "Pip"),
    ("rabbit", "Tilly"),
    ("bear", "Bruno"),
    ("owl", "Hoot"),
    ("mouse", "Nell"),
    ("duck", "Dot"),
    ("cat", "Mina"),
    ("frog", "Fennel"),
    ("hedgehog", "Quill"),
    ("badger", "Bram"),
    ("goat", "Clover"),
    ("squirrel", "Rusty"),
    ("turtle", "Moss"),
    ("wolf", "Ash"),
    ("lamb", "Poppy"),
]
HOMES = [
    "a small house near the river",
    "a hollow tree at the edge of the wood",
    "a warm burrow under the old oak",
    "a cottage on top of the green hill",
    "a little boat on the quiet lake",
    "a nest above the apple orchard",
    "a stone hut beside the mill",
    "a cosy den behind the waterfall",
]
PLACES = [
    "the market",
    "the meadow",
    "the forest",
    "the beach",
    "the old bridge",
    "the garden",
    "the village square",
    "the mountain path",
    "the pond",
    "the library",
    "the bakery",
]
THINGS = [
    ("a red kite", "the kite"),
    ("a silver key", "the key"),
    ("a blue hat", "the hat"),
    ("a jar of honey", "the honey"),
    ("a wooden flute", "the flute"),
    ("a lantern", "the lantern"),
    ("a map of the hills", "the map"),
    ("a basket of plums", "the basket"),
    ("a tiny bell", "the bell"),
    ("a book of songs", "the book"),
    ("a warm scarf", "the scarf"),
]
FEELINGS = ["happy", "sad", "curious", "brave", "tired", "worried", "proud", "sleepy", "excited"]
WEATHER = [
    "The sun was bright and the sky was clear.",
    "A soft rain was falling on the leaves.",
    "The wind was cold and the clouds were grey.",
    "Snow covered the fields like a white blanket.",
    "It was a warm and lazy summer afternoon.",
    "The morning fog hid the tops of the trees.",
]
# (what went wrong, how it felt, ways a friend can help with exactly that)
PROBLEMS = [
    (
        "lost {thing}",
        "could not find {the_thing} anywhere",
        [
            "searched under every leaf and stone until {the_thing} was found",
            "asked everyone at {place} until someone had seen {the_thing}",
        ],
    ),
    (
        "was stuck in the mud",
        "tried to pull free but only sank deeper",
        ["held out a paw and pulled with all their strength", "found a long branch and pulled {hero} out"],
    ),
    (
        "was afraid of the dark",
        "did not want to walk home after sunset",
        [
            "lit a lantern and walked side by side through the night",
            "sang a soft song until the fear went away",
        ],
    ),
    (
        "had no one to play with",
        "sat alone and watched the birds",
        ["shared a warm drink and told a funny story", "taught {hero} a new game with stones and sticks"],
    ),
    (
        "broke {thing}",
        "looked at the pieces and felt like crying",
        ["fixed it with glue, string and a lot of patience", "helped to make a new one that was even better"],
    ),
    (
        "forgot the way home",
        "walked in circles until the light began to fade",
        ["showed the way back along the winding path", "climbed a tall tree and pointed towards home"],
    ),
]
LESSONS = [
    "A friend in need is a friend indeed.",
    "Small kindnesses make big differences.",
    "It is brave to ask for help.",
    "Slow and steady wins the race.",
    "Sharing makes every treat taste sweeter.",
    "Even the longest night ends with a morning.",
    "Listening is the first step to understanding.",
    "Every mistake is a chance to learn.",
]
DIALOGUE = [
    '"Do not worry," said {helper}. "I will help you."',
    '"What is wrong?" asked {helper}. "You look {feeling}."',
    '"Thank you," said {hero} with a smile. "You are a true friend."',
    '"Let us try again tomorrow," said {helper}. "Things look better in the morning."',
    '"I have an idea!" cried {hero}. "Follow me!"',
    '"Can I come with you?" asked {helper}. "Of course," said {hero}.',
]
ENDINGS = [
    "From that day on, {hero} and {helper} were the best of friends.",
    "That night, {hero} fell asleep feeling {feeling} and warm.",
    "And every year after, they went back to {place} together.",
    "When the stars came out, everyone went home to bed.",
    "{hero} never forgot what {helper} had done.",
]


def _tale(rng: random.Random, number: int) -> str:
    (hero_kind, hero), (helper_kind, helper) = rng.sample(HEROES, 2)
    thing, the_thing = rng.choice(THINGS)
    place = rng.choice(PLACES)
    fill = dict(
        hero=hero, helper=helper, thing=thing, the_thing=the_thing, place=place, feeling=rng.choice(FEELINGS)
    )
    problem, consequence, helps = rng.choice(PROBLEMS)
    lines = [
        f"Tale {number}.",
        f"Once upon a time, there was a little {hero_kind} named {hero}.",
        f"{hero} lived in {rng.choice(HOMES)}.",
        rng.choice(WEATHER),
        f"One day, {hero} went to {place} and felt {fill['feeling']}.",
        f"But then {hero} {problem.format(**fill)}.",
        f"{hero} {consequence.format(**fill)}.",
        f"Just then, a kind {helper_kind} named {helper} came along.",
        rng.choice(DIALOGUE).format(**fill),
        f"{helper} {rng.choice(helps).format(**fill)}.",
        rng.choice(DIALOGUE).format(**fill),
        rng.choice(ENDINGS).format(**fill),
        f"The lesson: {rng.choice(LESSONS)}",
    ]
    return " ".join(lines[:4]) + "\n" + " ".join(lines[4:]) + "\n\n"


def generate(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    rng = random.Random(seed)
    tales: list[str] = []
    size = 0
    while size < target_bytes:
        tales.append(_tale(rng, len(tales) + 1))
        size += len(tales[-1])
    return "".join(tales)


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("tiny_tales.txt")
    out.write_text(generate(), encoding="ascii")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
