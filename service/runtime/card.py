"""The model card's schema under the name the service's routes import; service/runtime/model_dir.py owns it."""

from service.runtime.model_dir import (
    CARD_FILE,
    GRAPH_FILE,
    SUPPORTED_FORMAT_VERSIONS,
    CardError,
    DecoderSpec,
    FileEntry,
    InputSpec,
    ModelCard,
    OutputSpec,
    ReceptiveField,
    ScoresSpec,
    TensorSpec,
    parse_card,
)

__all__ = [
    "CARD_FILE",
    "GRAPH_FILE",
    "SUPPORTED_FORMAT_VERSIONS",
    "CardError",
    "DecoderSpec",
    "FileEntry",
    "InputSpec",
    "ModelCard",
    "OutputSpec",
    "ReceptiveField",
    "ScoresSpec",
    "TensorSpec",
    "parse_card",
]
