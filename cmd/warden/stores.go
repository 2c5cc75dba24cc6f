package main

// The stores this build of warden can open: each blank import registers its
// URL schemes with warden.Open. Adding a store to the CLI is one line here
// (and its module in go.mod).
import (
	_ "github.com/warden-go/warden/store/dynamo" // registers dynamodb://
	_ "github.com/warden-go/warden/store/memory" // registers memory://
	_ "github.com/warden-go/warden/store/mongo"  // registers mongodb:// and mongodb+srv://
	_ "github.com/warden-go/warden/store/mysql"  // registers mysql://
	_ "github.com/warden-go/warden/store/sqlite" // registers sqlite://
)
