"""Generated protobuf modules (NRI API, ttrpc envelope, CRI subset, kubelet pod-resources).

Do not edit: regenerate with `tox -e proto` (scripts/genproto.py) from proto/.
"""
