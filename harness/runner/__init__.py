"""fleetbench on-device runner: the package pushed to devices as one file.

Nothing of fleetbench outside this package is imported: the device needs Python >= 3.8,
numpy and the backend (``onnxruntime-training`` for ``ort``, the plain ``onnxruntime``
package for ``onnx``, PyTorch for ``torch``). Every module imports the standard library
and its siblings only (relative imports, so the same files work as ``harness.runner`` on
the host and as a top-level package inside the device's archive); numpy and the backend
are imported inside the modes, so a missing one becomes exit status 3 with a JSON
document naming it.

The host builds the package into one zip application (`harness.runner_archive`), which
a device runs as ``python3 runner.pyz bench|train|serve ...``. The command line, the JSON
document, the serve protocol and the exit codes are `harness.runner.protocol`'s.

Modules, one job each:

``protocol``    what host and device share: exit codes, file names, defaults, the document's keys
``sampling``    the statistics of one measurement: the median's interval, warm-up, disturbed samples
``failures``    the failures with a known status (bad arguments, missing runtime, out of memory, out of space)
``runtimes``    importing numpy and the backends' runtimes the runner's way; flushing denormals
``probes``      readings of the device: cpu frequencies, thermal zones, memory, load, versions
``power``       the device's power sensors: finding them, reading them, the energy over a stretch of time
``metering``    the energy of a mode's timed work: an idle window, the sensor read while the steps run
``artifacts``   an artifact set's manifest and files, and a random batch from its shapes
``backends``    the training backends (``ort``, ``onnx``, ``torch``) over one artifact set
``data``        shards and the batches ``bench`` and ``train`` step through
``arguments``   the command-line parser (also the serving runner's request checker)
``bench``       the ``bench`` mode
``train``       the ``train`` mode
``modes``       one mode's run into its document, whatever happens
``serve``       the resident runner
``__main__``    the entry point (stdout discipline, exit status)

Only ``protocol``, ``sampling``, ``failures`` and ``runtimes`` are for the host to import
(import-linter holds the rest to the device).
"""
