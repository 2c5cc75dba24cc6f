package mongo

// UseMongoPaths makes a store opened with o take MongoDB's code paths even
// on FerretDB.
func UseMongoPaths(o *Options) { o.mongoPaths = true }
