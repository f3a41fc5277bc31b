"""The repository's index built off the request path, for the HTTP server and the LSP alike."""

import logging
from pathlib import Path

from specdec_server.longlived import freeze_what_is_loaded

log = logging.getLogger("specdec.server")


def build_and_attach(root: Path, engine_of):
    """Index `root` (tree-sitter, then the files read for retrieval) and attach the index to the
    engine current when it is done (engine_of(): a reload may have replaced the engine). Returns
    the index; raises what the build raised, and the engine keeps serving without one."""
    from prefixcache import Index

    log.info("indexing %s", root)
    index = Index.build(root)
    engine_of().attach_index(index)
    freeze_what_is_loaded()  # the index lives as long as the server: keep it out of full collections
    return index
