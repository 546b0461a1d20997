"""What comes into the store from outside a process's own recording: the span model
(:mod:`.spans`), the mapping of loopscope's own and other instrumentations' conventions
to rows (:mod:`.mapping`, :mod:`.foreign`), the writer fed spans (:mod:`.writer`), the
span processor of this process (:mod:`.processor`), the closing of turns a dead process
left open (:mod:`.recovery`), the OTLP receiver (:mod:`.otlp`) and AG-UI import and
export (:mod:`.agui`). It writes through the store's API (:mod:`loopscope.storage`)
and never the other way round."""
