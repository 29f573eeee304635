//! The login phase of one connection (RFC 7143 sections 6 and 11.12-13):
//! stages and transitions, security negotiation (AuthMethod None or CHAP,
//! one-way or mutual), operational negotiation, and the status codes of a
//! refused login.
//!
//! Owns: the login state machine, Login Request in, Login Response out.
//! Must not touch: sockets (the server moves the PDUs) or the full-feature
//! phase (it starts from the [`LoggedIn`] this returns).
//! Invariants:
//! - a target that requires CHAP never lets a connection reach the
//!   operational or full-feature stage without a verified CHAP_R;
//! - every refusal is a Login Response with a non-zero status class, after
//!   which the connection closes;
//! - the target never moves to a stage the initiator did not ask for, and
//!   never transits while the initiator's T bit is clear.

use crate::catalog::{ChapCredentials, ChapSecret, TargetCatalog, TargetEntry};
use crate::chap;
use crate::pdu::{LoginRequest, LoginResponse, Pdu};
use crate::text::{self, negotiate_key, KeyAnswer, SessionParams, SessionType, TargetLimits};
use bytes::Bytes;
use rand::RngCore;

/// Security negotiation stage.
pub const STAGE_SECURITY: u8 = 0;
/// Operational negotiation stage.
pub const STAGE_OPERATIONAL: u8 = 1;
/// Full-feature phase.
pub const STAGE_FULL_FEATURE: u8 = 3;

/// Login status codes (class << 8 | detail).
pub mod status {
    /// Success.
    pub const SUCCESS: u16 = 0x0000;
    /// Initiator error (a malformed request).
    pub const INITIATOR_ERROR: u16 = 0x0200;
    /// Authentication failed.
    pub const AUTHENTICATION_FAILURE: u16 = 0x0201;
    /// The initiator may not access this target.
    pub const AUTHORIZATION_FAILURE: u16 = 0x0202;
    /// No such target.
    pub const TARGET_NOT_FOUND: u16 = 0x0203;
    /// Version not supported.
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    /// A required key is missing.
    pub const MISSING_PARAMETER: u16 = 0x0207;
    /// Session type not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    /// The session named by TSIH does not exist.
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020a;
    /// A request not allowed during login.
    pub const INVALID_DURING_LOGIN: u16 = 0x020b;
    /// The target could not serve.
    pub const TARGET_ERROR: u16 = 0x0300;
    /// The target is not available now; the initiator may retry later.
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
}

/// Where CHAP stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    /// Nothing negotiated yet.
    Start,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    AwaitAlgorithm,
    /// Challenge sent; waiting for CHAP_N and CHAP_R.
    AwaitResponse { id: u8, challenge: Vec<u8> },
    /// Authenticated, or no authentication needed.
    Done,
}

/// A finished login: what the full-feature phase starts from.
#[derive(Debug, Clone)]
pub struct LoggedIn {
    /// Normal or discovery.
    pub session_type: SessionType,
    /// The target (normal sessions).
    pub target: Option<TargetEntry>,
    /// InitiatorName.
    pub initiator_name: String,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH assigned.
    pub tsih: u16,
    /// Connection ID.
    pub cid: u16,
    /// Negotiated parameters.
    pub params: SessionParams,
    /// The CmdSN the first command will carry.
    pub exp_cmd_sn: u32,
    /// The MaxCmdSN the last Login Response advertised.
    pub max_cmd_sn: u32,
    /// The next StatSN to send.
    pub stat_sn: u32,
}

/// What to do after a Login Request.
#[derive(Debug)]
pub enum LoginStep {
    /// Send the response and wait for the next request.
    Continue(Pdu),
    /// Send the response and close the connection.
    Refuse(Pdu, u16),
    /// Send the response; the connection is in the full-feature phase.
    Complete(Pdu, Box<LoggedIn>),
}

/// The login phase of one connection.
pub struct Login {
    limits: TargetLimits,
    window: u32,
    tsih: u16,
    params: SessionParams,
    started: bool,
    stage: u8,
    auth: Auth,
    chap: ChapCredentials,
    chap_required: bool,
    session_type: SessionType,
    initiator_name: String,
    target: Option<TargetEntry>,
    isid: [u8; 6],
    itt: u32,
    cid: u16,
    cmd_sn: u32,
    stat_sn: u32,
    /// Text of a request sent over several PDUs (C bit).
    partial: Vec<u8>,
    /// Our MaxRecvDataSegmentLength declaration is sent once.
    declared: bool,
}

impl Login {
    /// A login that will assign `tsih` and open a CmdSN window of `window`
    /// commands.
    pub fn new(limits: TargetLimits, tsih: u16, window: u32) -> Login {
        Login {
            limits,
            window: window.max(1),
            tsih,
            params: SessionParams::default(),
            started: false,
            stage: STAGE_SECURITY,
            auth: Auth::Start,
            chap: ChapCredentials::default(),
            chap_required: false,
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            target: None,
            isid: [0; 6],
            itt: 0,
            cid: 0,
            cmd_sn: 0,
            stat_sn: 0,
            partial: Vec::new(),
            declared: false,
        }
    }

    fn response(
        &mut self,
        transit: bool,
        next_stage: u8,
        status: u16,
        pairs: &[(String, String)],
    ) -> Pdu {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let complete = transit && next_stage == STAGE_FULL_FEATURE && status == 0;
        Pdu::LoginResponse(LoginResponse {
            transit,
            continue_text: false,
            current_stage: self.stage,
            next_stage: if transit { next_stage } else { 0 },
            version_max: 0,
            version_active: 0,
            isid: self.isid,
            tsih: if complete { self.tsih } else { 0 },
            itt: self.itt,
            stat_sn,
            exp_cmd_sn: self.cmd_sn,
            max_cmd_sn: self.cmd_sn.wrapping_add(self.window - 1),
            status_class: (status >> 8) as u8,
            status_detail: status as u8,
            data: Bytes::from(text::encode(pairs)),
        })
    }

    fn refuse(&mut self, status: u16, why: &str) -> LoginStep {
        tracing::info!(
            "iSCSI login of {:?} to {:?} refused ({status:#06x}): {why}",
            self.initiator_name,
            self.target.as_ref().map(|t| t.name.as_str())
        );
        let pdu = self.response(false, 0, status, &[]);
        LoginStep::Refuse(pdu, status)
    }

    /// Handles one Login Request.
    pub fn handle(&mut self, catalog: &dyn TargetCatalog, req: LoginRequest) -> LoginStep {
        if !self.started {
            self.started = true;
            self.isid = req.isid;
            self.itt = req.itt;
            self.cid = req.cid;
            self.cmd_sn = req.cmd_sn;
            self.stat_sn = req.exp_stat_sn;
            self.stage = req.current_stage;
            if req.version_min > 0 {
                return self.refuse(status::UNSUPPORTED_VERSION, "version above 0");
            }
            if req.tsih != 0 {
                return self.refuse(
                    status::SESSION_DOES_NOT_EXIST,
                    "adding a connection to a session is not supported (MaxConnections=1)",
                );
            }
        } else if req.isid != self.isid || req.cid != self.cid {
            return self.refuse(status::INITIATOR_ERROR, "ISID or CID changed during login");
        }
        self.itt = req.itt;
        self.cmd_sn = req.cmd_sn;
        if req.current_stage != self.stage {
            // A new stage starts only after a transit both sides agreed to.
            return self.refuse(status::INITIATOR_ERROR, "unexpected current stage");
        }
        if req.current_stage == 2 || req.current_stage == STAGE_FULL_FEATURE {
            return self.refuse(status::INITIATOR_ERROR, "invalid current stage");
        }
        if req.transit && (req.next_stage <= req.current_stage || req.next_stage == 2) {
            return self.refuse(status::INITIATOR_ERROR, "invalid next stage");
        }
        if self.partial.len() + req.data.len() > text::MAX_TEXT_BYTES {
            return self.refuse(status::INITIATOR_ERROR, "login text too long");
        }
        self.partial.extend_from_slice(&req.data);
        if req.continue_text {
            if req.transit {
                return self.refuse(status::INITIATOR_ERROR, "T and C bits both set");
            }
            let pdu = self.response(false, 0, 0, &[]);
            return LoginStep::Continue(pdu);
        }
        let data = std::mem::take(&mut self.partial);
        let pairs = match text::parse(&data) {
            Ok(p) => p,
            Err(e) => return self.refuse(status::INITIATOR_ERROR, &e.to_string()),
        };
        let first = self.initiator_name.is_empty();
        if first {
            if let Some(step) = self.identify(catalog, &pairs) {
                return step;
            }
        }
        let mut replies = Vec::new();
        match self.stage {
            STAGE_SECURITY => {
                if let Some(step) = self.security(&pairs, &mut replies) {
                    return step;
                }
            }
            _ => {
                if pairs
                    .iter()
                    .any(|(k, _)| k == "AuthMethod" || k.starts_with("CHAP_"))
                {
                    return self.refuse(
                        status::INITIATOR_ERROR,
                        "security keys outside the security stage",
                    );
                }
                if self.chap_required && self.auth != Auth::Done {
                    return self.refuse(
                        status::AUTHENTICATION_FAILURE,
                        "CHAP is required and the security stage was skipped",
                    );
                }
            }
        }
        for (key, value) in &pairs {
            if is_login_identity_or_security(key) {
                continue;
            }
            match negotiate_key(
                &mut self.params,
                &self.limits,
                self.session_type,
                key,
                value,
            ) {
                KeyAnswer::Reply(v) => replies.push((key.clone(), v)),
                KeyAnswer::Silent => {}
            }
        }
        // Our declarations, unless a key of the same name is already
        // answered in this text (a key appears once per text).
        let mut declarations = Vec::new();
        if self.stage == STAGE_OPERATIONAL && !self.declared {
            declarations.push((
                "MaxRecvDataSegmentLength".to_string(),
                self.limits.max_recv_data_segment_length.to_string(),
            ));
        }
        if first {
            if let Some(target) = &self.target {
                declarations.push((
                    "TargetPortalGroupTag".into(),
                    target.portal_group_tag.to_string(),
                ));
                if let Some(alias) = &target.alias {
                    declarations.push(("TargetAlias".into(), alias.clone()));
                }
            }
        }
        for (key, value) in declarations {
            if replies.iter().any(|(k, _)| *k == key) {
                continue;
            }
            if key == "MaxRecvDataSegmentLength" {
                self.declared = true;
            }
            replies.push((key, value));
        }
        // Transit when the initiator asks and, in the security stage, once
        // authentication is done.
        let may_transit = req.transit && (self.stage != STAGE_SECURITY || self.auth == Auth::Done);
        if !may_transit {
            let pdu = self.response(false, 0, 0, &replies);
            return LoginStep::Continue(pdu);
        }
        if req.next_stage == STAGE_FULL_FEATURE {
            self.params.settle(&self.limits);
            let pdu = self.response(true, STAGE_FULL_FEATURE, 0, &replies);
            let logged_in = LoggedIn {
                session_type: self.session_type,
                target: self.target.clone(),
                initiator_name: self.initiator_name.clone(),
                isid: self.isid,
                tsih: self.tsih,
                cid: self.cid,
                params: self.params,
                exp_cmd_sn: self.cmd_sn,
                max_cmd_sn: self.cmd_sn.wrapping_add(self.window - 1),
                stat_sn: self.stat_sn,
            };
            return LoginStep::Complete(pdu, Box::new(logged_in));
        }
        let pdu = self.response(true, req.next_stage, 0, &replies);
        self.stage = req.next_stage;
        LoginStep::Continue(pdu)
    }

    /// The first request names the initiator, the session type and the
    /// target; checks them against the catalog.
    fn identify(
        &mut self,
        catalog: &dyn TargetCatalog,
        pairs: &[(String, String)],
    ) -> Option<LoginStep> {
        let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let Some(initiator) = get("InitiatorName").filter(|v| !v.is_empty()) else {
            return Some(self.refuse(status::MISSING_PARAMETER, "no InitiatorName"));
        };
        self.initiator_name = initiator.clone();
        self.session_type = match get("SessionType").map(String::as_str) {
            None | Some("Normal") => SessionType::Normal,
            Some("Discovery") => SessionType::Discovery,
            Some(_) => {
                return Some(self.refuse(status::SESSION_TYPE_NOT_SUPPORTED, "unknown SessionType"))
            }
        };
        match self.session_type {
            SessionType::Discovery => {
                self.chap = catalog.discovery_chap();
            }
            SessionType::Normal => {
                let Some(name) = get("TargetName").filter(|v| !v.is_empty()) else {
                    return Some(self.refuse(status::MISSING_PARAMETER, "no TargetName"));
                };
                let Some(target) = catalog.target(name) else {
                    if let Some(why) = catalog.refusal(name) {
                        return Some(self.refuse(status::SERVICE_UNAVAILABLE, &why));
                    }
                    return Some(self.refuse(status::TARGET_NOT_FOUND, "no such target"));
                };
                if !target.admits(initiator) {
                    self.target = Some(target);
                    return Some(self.refuse(
                        status::AUTHORIZATION_FAILURE,
                        "initiator not in the target's access list",
                    ));
                }
                self.chap = target.chap.clone();
                self.target = Some(target);
            }
        }
        self.chap_required = self.chap.initiator.is_some();
        if !self.chap_required && self.stage == STAGE_OPERATIONAL {
            self.auth = Auth::Done;
        }
        None
    }

    /// Security-stage keys: AuthMethod and the CHAP exchange.
    fn security(
        &mut self,
        pairs: &[(String, String)],
        replies: &mut Vec<(String, String)>,
    ) -> Option<LoginStep> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        match self.auth.clone() {
            Auth::Start => {
                let Some(methods) = get("AuthMethod") else {
                    if self.chap_required {
                        return Some(
                            self.refuse(status::AUTHENTICATION_FAILURE, "no AuthMethod offered"),
                        );
                    }
                    self.auth = Auth::Done;
                    return None;
                };
                let offered: Vec<&str> = methods.split(',').collect();
                if self.chap_required {
                    if !offered.contains(&"CHAP") {
                        return Some(self.refuse(
                            status::AUTHENTICATION_FAILURE,
                            "CHAP is required and was not offered",
                        ));
                    }
                    replies.push(("AuthMethod".into(), "CHAP".into()));
                    self.auth = Auth::AwaitAlgorithm;
                } else if offered.contains(&"None") {
                    replies.push(("AuthMethod".into(), "None".into()));
                    self.auth = Auth::Done;
                } else {
                    replies.push(("AuthMethod".into(), "Reject".into()));
                    return Some(self.refuse(
                        status::AUTHENTICATION_FAILURE,
                        "no CHAP secret configured and None not offered",
                    ));
                }
                None
            }
            Auth::AwaitAlgorithm => {
                let Some(algorithms) = get("CHAP_A") else {
                    return Some(self.refuse(status::AUTHENTICATION_FAILURE, "no CHAP_A"));
                };
                if !algorithms.split(',').any(|a| a == chap::CHAP_MD5) {
                    return Some(self.refuse(
                        status::AUTHENTICATION_FAILURE,
                        "no CHAP algorithm in common (MD5 only)",
                    ));
                }
                let mut rng = rand::thread_rng();
                let id = (rng.next_u32() & 0xff) as u8;
                let mut challenge = vec![0u8; chap::CHALLENGE_BYTES];
                rng.fill_bytes(&mut challenge);
                replies.push(("CHAP_A".into(), chap::CHAP_MD5.into()));
                replies.push(("CHAP_I".into(), id.to_string()));
                replies.push(("CHAP_C".into(), chap::encode_hex(&challenge)));
                self.auth = Auth::AwaitResponse { id, challenge };
                None
            }
            Auth::AwaitResponse { id, challenge } => {
                match self.verify(id, &challenge, pairs, replies) {
                    Ok(()) => {
                        self.auth = Auth::Done;
                        None
                    }
                    Err(why) => Some(self.refuse(status::AUTHENTICATION_FAILURE, why)),
                }
            }
            Auth::Done => {
                if pairs
                    .iter()
                    .any(|(k, _)| k == "AuthMethod" || k.starts_with("CHAP_"))
                {
                    return Some(self.refuse(
                        status::AUTHENTICATION_FAILURE,
                        "security keys after authentication ended",
                    ));
                }
                None
            }
        }
    }

    fn verify(
        &self,
        id: u8,
        challenge: &[u8],
        pairs: &[(String, String)],
        replies: &mut Vec<(String, String)>,
    ) -> Result<(), &'static str> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let expected: &ChapSecret = self.chap.initiator.as_ref().ok_or("no CHAP secret")?;
        let name = get("CHAP_N").ok_or("no CHAP_N")?;
        let answer = get("CHAP_R").ok_or("no CHAP_R")?;
        let answer = chap::decode_binary(answer).ok_or("malformed CHAP_R")?;
        if name != expected.user {
            return Err("unknown CHAP user");
        }
        let wanted = chap::response(id, &expected.secret, challenge);
        if !chap::same(&answer, &wanted) {
            return Err("wrong CHAP response");
        }
        match (get("CHAP_I"), get("CHAP_C")) {
            (None, None) => Ok(()),
            (Some(i), Some(c)) => {
                let target_secret = self
                    .chap
                    .target
                    .as_ref()
                    .ok_or("mutual CHAP not configured")?;
                let their_id = chap::parse_identifier(i).ok_or("malformed CHAP_I")?;
                let their_challenge = chap::decode_binary(c).ok_or("malformed CHAP_C")?;
                if their_challenge.len() < chap::MIN_CHALLENGE_BYTES
                    || their_challenge.len() > chap::MAX_CHALLENGE_BYTES
                {
                    return Err("CHAP_C length out of range");
                }
                if chap::same(&their_challenge, challenge) {
                    return Err("reflected CHAP challenge");
                }
                if chap::same(&target_secret.secret, &expected.secret) {
                    return Err("mutual CHAP needs different secrets per direction");
                }
                let r = chap::response(their_id, &target_secret.secret, &their_challenge);
                replies.push(("CHAP_N".into(), target_secret.user.clone()));
                replies.push(("CHAP_R".into(), chap::encode_hex(&r)));
                Ok(())
            }
            _ => Err("CHAP_I without CHAP_C or the reverse"),
        }
    }
}

/// Keys the login consumes itself rather than negotiating.
fn is_login_identity_or_security(key: &str) -> bool {
    matches!(
        key,
        "InitiatorName" | "SessionType" | "TargetName" | "AuthMethod" | "InitiatorAlias"
    ) || key.starts_with("CHAP_")
}
