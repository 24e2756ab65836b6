"""This machine's plumbing: its processes, private files, devices, network and console.

- processes: ``proctree`` (find, name, kill a tree), ``title`` (what ``ps`` shows),
  ``namespaces`` (the Linux namespaces a warm process's child joins), ``unix_socket``;
- files: ``basedir`` (a node's base directory), ``workdirs`` (a call's private directory),
  ``private`` (files only this user may read), ``logs`` and ``retention`` (per-rank logs);
- the machine: ``devices`` (CUDA devices, torch unimported), ``gpu_usage``, ``network``;
- talking: ``console`` (the task's lines to the user), ``log`` (the debug channel).

It may import ``base`` only: no Metaflow, nothing of the gang (import-linter holds both), since
the ranks import it too. Nothing is re-exported here: every rank's start passes through this
package (``procs/handoff.py``), so each module is imported by its path.
"""
