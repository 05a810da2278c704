"""What training/ may import from service/: the names both sides must compute the same way, and nothing else.

The model directory (export writes it, evaluation and the service read it; `service/runtime/model_dir.py`),
the service's preprocessing of uploads (the non-digit sets go through it; `service/imaging.py`), the
"not a digit" score (calibration writes its card entry, the service computes it; `service/runtime/ood.py`), the
occlusion maps (the faithfulness report measures the ones the service serves; `service/explanation.py`) and the
torch-free machine facts every benchmark records (`service/machine.py`). tests/test_layout.py fails when a
training module outside training/benchmarks/ imports any other service module; docs/code-layout.md says why.
"""

from service.explanation import (
    OCCLUSION_TILE,
    input_heatmap,
    occluded_copies,
    occlusion_grid,
    occlusion_grid_size,
    occlusion_tiles,
)
from service.imaging import ImageDecodeError, ImageLimits, array_from_pixels, array_to_png, decode_image, preprocess
from service.machine import cpu_busy_percent, cpu_model, load_average, usable_cpus
from service.runtime.model_dir import (
    CARD_FILE,
    CARD_FORMAT_VERSION,
    DECODER_FILE,
    GRAPH_FILE,
    ModelCard,
    ModelDir,
    ModelDirError,
    ProviderUnavailable,
    create_session,
    default_intra_op_threads,
    file_entries,
    is_model_dir,
    load_model_dir,
    parse_card,
    portable_command,
    portable_path,
    read_card,
    session_options,
    sha256_file,
    verify_files,
    write_card,
)
from service.runtime.ood import (
    FEATURE_TAILS,
    GAUSSIAN_FEATURES,
    ClassGaussian,
    OODCalibration,
    image_features,
    one_blas_thread,
)
from service.runtime.ood_pattern import VECTOR_INPUTS, PatternNetwork, capsule_vector

__all__ = [
    "CARD_FILE",
    "CARD_FORMAT_VERSION",
    "DECODER_FILE",
    "FEATURE_TAILS",
    "GAUSSIAN_FEATURES",
    "GRAPH_FILE",
    "OCCLUSION_TILE",
    "VECTOR_INPUTS",
    "ClassGaussian",
    "ImageDecodeError",
    "ImageLimits",
    "ModelCard",
    "ModelDir",
    "ModelDirError",
    "OODCalibration",
    "PatternNetwork",
    "ProviderUnavailable",
    "array_from_pixels",
    "array_to_png",
    "capsule_vector",
    "cpu_busy_percent",
    "cpu_model",
    "create_session",
    "decode_image",
    "default_intra_op_threads",
    "file_entries",
    "image_features",
    "input_heatmap",
    "is_model_dir",
    "load_average",
    "load_model_dir",
    "occluded_copies",
    "occlusion_grid",
    "occlusion_grid_size",
    "occlusion_tiles",
    "one_blas_thread",
    "parse_card",
    "portable_command",
    "portable_path",
    "preprocess",
    "read_card",
    "session_options",
    "sha256_file",
    "usable_cpus",
    "verify_files",
    "write_card",
]
