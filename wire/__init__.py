"""The vocabulary node and client share: what travels between them and how it is
named. Errors (`errors`) and their gRPC statuses (`status`); the ring value (`ring`:
its wire form in `ring_wire`, merging views in `ring_merge`; `balancers` names its
policy); positions of keys (`hashing`) and the pieces a shared key is spread over
(`pieces`); the msgpack codec (`codec`); epoch sources' (source, seq) numbering
(`epochs`); the TLS files and server names (`tls`) and the channels a caller dials a
member with (`channels`).

Nothing here imports the node or the mapper. `errors`, `hashing`, `codec`,
`balancers`, `pieces`, `epochs` and the three `ring` modules are pure (no I/O, no
gRPC): the node's core and the simulation use them; `status`, `tls` and `channels`
speak gRPC."""

__may_import__ = ("floering.wire", "floering.v1", "*")
