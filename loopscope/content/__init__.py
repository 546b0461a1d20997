"""What content may be kept or sent, wherever it goes: the content policy (:mod:`.policy`)
and the credential shapes it masks (:mod:`.secrets`). The store's writer, the collector
and the OTLP exporter apply the same policy, so it sits below all of them."""
