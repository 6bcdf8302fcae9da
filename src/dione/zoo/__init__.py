"""Small real models and data sets that ship with installed packages (no downloads)."""

from dione.zoo.chargpt import CharGPT, sequence_cross_entropy
from dione.zoo.digits import digits_accuracy, digits_mlp, digits_test, digits_train
from dione.zoo.text import stdlib_text, text_train, text_validation, text_validation_loss

__all__ = [
    "CharGPT",
    "digits_accuracy",
    "digits_mlp",
    "digits_test",
    "digits_train",
    "sequence_cross_entropy",
    "stdlib_text",
    "text_train",
    "text_validation",
    "text_validation_loss",
]
