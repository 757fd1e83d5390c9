//! Adoption (DESIGN §11): the MCP servers users already configured in their
//! hosts become units, and hosts are pointed at `mcpctl bridge`.
//!
//! Reading order: [`hosts`] (which hosts, where their files are, how an
//! entry reads), [`convert`] (an entry → a unit and its env-file, pure),
//! [`pair`] (which unit an entry is, pure), [`connect`] (rewriting a
//! host's file and undoing it, pure), [`plan`] (what `mcpctl connect`
//! does, decided in one place: the file's text and the units in, the plan
//! out), [`import`] (what `mcpctl import` does, likewise: the hosts'
//! files as read and what is there now in, the rows and the files to
//! write out). The command around them, with the file I/O, is
//! `ctl::import`.

pub mod connect;
pub mod convert;
pub mod hosts;
pub mod import;
pub mod pair;
pub mod plan;
