"""The auditor's path: `verinfer reproduce REF` checks one receipt from its signature to a
replay on the auditor's own machine (docs/cookbook.md). It reuses the verifier's pieces —
receipt parsing and location (verifier/challenger.py), the request rule's conformance check
(verifier/conformance.py) and the re-execution (verifier/reexec.py) — and adds only what an
auditor outside the committee needs: keys or transcripts it holds, a model file it brings, and
a report a person can read."""
