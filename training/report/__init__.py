"""Regenerate docs/REPORT.md: MNIST error against the papers, baseline CNN, affine robustness, MultiMNIST, speed.

    python -m training.report [--data-dir DIR] [--out docs] [--tiny] [--reuse] [--sections S ...]

Every number comes from a section run by this command. A run saves its numbers as JSON (and arrays for
figures as .npz) under <out>/report/ with the time and the command; `--reuse` renders those instead of
running again, and a section not selected with `--sections` is rendered from its saved result when there
is one. A section that has never run is shown as "not yet measured", with the reason.
"""
