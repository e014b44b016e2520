"""What generated training scripts import: meshes, chunk executor, state store, P2P, All-Scan.

The runtime never imports the front end or the lowering passes.
"""
