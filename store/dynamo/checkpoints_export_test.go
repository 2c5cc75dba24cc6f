package dynamo

// PauseCheckpoint implements drivertest.CheckpointPauser: the next Save,
// Cleanup or DeleteAll of taskID in this store's namespace calls f between
// its write of the task's fence and its next write, so that the
// conformance suite can run a newer holder's calls while a zombie's
// request is on its way.
func (c checkpoints) PauseCheckpoint(taskID string, f func()) {
	pauses.Store(c.s.cpPfx+taskID, f)
}
