package wirepb

// IsTerminal reports whether t ends a run or an embedding call: exactly
// one event of a terminal type ends each (ARCHITECTURE.md decision 5), and
// nothing follows it. Unspecified and the delta and usage types are not
// terminal.
func (t RunEventType) IsTerminal() bool {
	switch t {
	case RunEventType_RUN_EVENT_TYPE_COMPLETED,
		RunEventType_RUN_EVENT_TYPE_FAILED,
		RunEventType_RUN_EVENT_TYPE_CANCELLED,
		RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED,
		RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED,
		RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		return true
	}
	return false
}
